"""``python -m ctxrules ...``: the same command line as the ``ctxrules`` console script (for an
environment whose scripts folder is not on PATH, or to pick the interpreter explicitly)."""

from ctxrules.cli.main import main

if __name__ == "__main__":
    main()
