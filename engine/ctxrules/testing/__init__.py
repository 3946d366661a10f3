"""Test helpers for pack authors: a pytest plugin (entry point ``pytest11``) and a syrupy
extension that stores each assembled prompt as a readable text file."""
