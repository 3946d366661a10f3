"""System-prompt assembly: sections, modes, per-model discipline."""
