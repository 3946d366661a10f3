"""From a shell command line to the argv a compressor rule is matched against.

Agents send whole shell snippets (``cd app && FOO=1 python -m pytest -q 2>&1 | tail -40``),
so the command whose output we see is found like this (docs/compressors.md "Matching"):

1. The line is split into words the way a POSIX shell would (quotes, escapes); a word that
   starts with ``#`` starts a comment. If the quoting does not parse, the last line is split
   on whitespace instead.
2. Commands are separated by ``&&``, ``||``, ``;``, ``&`` and newlines; the **last** one is
   the one whose output ends the result. Trailing reporting commands (``echo``, ``printf``,
   ``true``, ``:``, ``exit``) are skipped: ``pytest; echo "exit=$?"`` is a pytest run.
3. In that command's pipeline, when every stage after the first only passes lines through or
   cuts them (``head``, ``tail``, ``cat``, ``tee``, ``less``, ``more``), the first stage is the
   producer (``pytest | tail -40`` is pytest's output, shortened); otherwise the last stage
   is (``git log | grep fix`` prints grep's lines).
4. Redirections (``2>&1``, ``> out.txt``), leading ``VAR=value`` assignments and wrappers
   (``sudo``, ``env``, ``time``, ``timeout 60``, ``nice``, ``nohup``, ``stdbuf``, ``command``,
   ``exec``, ``xargs``, ``uv run``, ``poetry run``, ``pipenv run``, ``pdm run``, ``hatch run``,
   ``rye run``, ``pipx run``, ``bundle exec``, ``npx``, ``bunx``, ``pnpm exec|dlx``,
   ``yarn dlx``, ``python -m``) are removed:
   ``npx jest`` is ``jest`` and ``python3 -m pytest`` is ``pytest``.
5. A shell given a script (``sh -c '...'``, ``bash -lc '...'``, ``zsh -ec '...'``) is the
   script: it is parsed by these same steps (nested shells too, a few levels deep), so
   ``bash -lc 'cd /repo && pytest -v 2>&1 | tail -n 50'`` is a pytest run.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass

__all__ = ["CommandLine", "parse_command", "positionals"]

_PUNCT = ";&|<>()\n"
_SEPARATORS = {"&&", "||", ";", "&", ";;", "\n"}
_REPORTING = frozenset({"echo", "printf", "true", ":", "exit"})
_TRANSPARENT = frozenset({"head", "tail", "cat", "tee", "less", "more"})
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_SHELL_WORDS = frozenset({"then", "do", "else", "elif", "{", "!", "time"})
# Wrappers: name -> how many option-less arguments follow before the real command.
_WRAPPERS: dict[str, int] = {
    "sudo": 0,
    "env": 0,
    "nice": 0,
    "nohup": 0,
    "stdbuf": 0,
    "command": 0,
    "exec": 0,
    "xargs": 0,
    "npx": 0,
    "bunx": 0,
    "time": 0,
    "timeout": 1,
    "caffeinate": 0,
    "chronic": 0,
}
# Options of wrappers that take a value (so the value is not taken for the command).
_WRAPPER_VALUE_OPTS: dict[str, frozenset[str]] = {
    "sudo": frozenset({"-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U"}),
    "env": frozenset({"-u", "-C", "-S", "--unset", "--chdir"}),
    "nice": frozenset({"-n", "--adjustment"}),
    "timeout": frozenset({"-s", "-k", "--signal", "--kill-after"}),
    "xargs": frozenset({"-n", "-P", "-I", "-L", "-s", "-d", "-E", "-a"}),
    "npx": frozenset({"-p", "--package", "-c", "--call"}),
}
# "<program> <subcommand>" pairs that run the rest of the line as a command.
_RUNNERS: dict[str, frozenset[str]] = {
    "uv": frozenset({"run", "tool run"}),
    "uvx": frozenset({""}),
    "poetry": frozenset({"run"}),
    "pipenv": frozenset({"run"}),
    "pdm": frozenset({"run"}),
    "hatch": frozenset({"run"}),
    "rye": frozenset({"run"}),
    "pipx": frozenset({"run"}),
    "bundle": frozenset({"exec"}),
    "pnpm": frozenset({"exec", "dlx"}),
    "yarn": frozenset({"dlx", "exec"}),
    "bun": frozenset({"x"}),
    "conda": frozenset({"run"}),
    "pixi": frozenset({"run"}),
}
_RUNNER_VALUE_OPTS = frozenset(
    {
        "--with",
        "--python",
        "-p",
        "--directory",
        "--project",
        "--from",
        "-n",
        "--name",
        "--env",
        "-e",
        "--package",
    }
)
_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "fish"})
# Shell options that take a value (`bash -o pipefail -c ...`, `bash --rcfile f -c ...`).
_SHELL_VALUE_OPTS = frozenset({"-o", "+o", "-O", "+O", "--rcfile", "--init-file"})
_MAX_SHELL_DEPTH = 4
_PYTHON = re.compile(r"python(?:\d+(?:\.\d+)*)?(?:\.exe)?|pypy\d*")


@dataclass(frozen=True)
class CommandLine:
    """The command whose output a rule sees.

    ``argv`` has wrappers, assignments and redirections removed and ``argv[0]`` reduced to its
    basename; ``piped`` is true when the producer's output went through further pipeline
    stages (``pytest | tail -40``) or was itself the last of several (``git log | grep x``).
    """

    argv: tuple[str, ...]
    piped: bool = False

    @property
    def program(self) -> str:
        return self.argv[0] if self.argv else ""


def _strip_comments(command: str) -> str:
    """``command`` without shell comments: ``#`` at the start of a word, outside quotes."""
    out: list[str] = []
    quote = ""
    i = 0
    while i < len(command):
        ch = command[i]
        if quote:
            out.append(ch)
            if ch == "\\" and quote == '"' and i + 1 < len(command):
                out.append(command[i + 1])
                i += 1
            elif ch == quote:
                quote = ""
        elif ch == "\\" and i + 1 < len(command):
            out.append(command[i : i + 2])
            i += 1
        elif ch in "'\"":
            quote = ch
            out.append(ch)
        elif ch == "#" and (i == 0 or command[i - 1] in " \t\n;&|()"):
            end = command.find("\n", i)
            if end < 0:
                break
            i = end
            continue
        else:
            out.append(ch)
        i += 1
    return "".join(out)


_HEREDOC = re.compile(r"<<(-?)\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\2")


def _strip_heredocs(command: str) -> str:
    """``command`` without here-document bodies (``cat <<'EOF' > f`` ... ``EOF``): their text is
    data, and an apostrophe in it must not open a quote for the rest of the line."""
    if "<<" not in command:
        return command
    out: list[str] = []
    pending: list[tuple[str, bool]] = []
    for line in command.split("\n"):
        if pending:
            delimiter, dash = pending[0]
            if (line.lstrip("\t") if dash else line) == delimiter:
                pending.pop(0)
            continue
        out.append(line)
        pending = [(m.group(3), bool(m.group(1))) for m in _HEREDOC.finditer(line)]
    return "\n".join(out)


def _words(command: str) -> list[str]:
    lexer = shlex.shlex(_strip_comments(_strip_heredocs(command)), posix=True, punctuation_chars=_PUNCT)
    lexer.whitespace = " \t\r"
    lexer.whitespace_split = True
    lexer.commenters = ""
    return list(lexer)


def _fallback_words(command: str) -> list[str]:
    # Unbalanced quotes (a heredoc, a truncated command): the last non-empty line, split plainly.
    lines = [ln for ln in command.splitlines() if ln.strip()]
    return lines[-1].split() if lines else []


def _split(words: list[str]) -> list[list[list[str]]]:
    """Commands (split at separators), each a pipeline (a list of stages, each a word list)."""
    commands: list[list[list[str]]] = [[[]]]
    pending_redirect = False
    for word in words:
        is_punct = bool(word) and set(word) <= set(_PUNCT)
        if is_punct:
            if "\n" in word or any(sep in word for sep in (";", "&&", "||")) or word == "&":
                commands.append([[]])
                pending_redirect = False
            elif word in ("|", "|&"):
                commands[-1].append([])
                pending_redirect = False
            elif "<" in word or ">" in word:
                stage = commands[-1][-1]
                if stage and stage[-1].isdigit():
                    stage.pop()  # the fd number of "2>&1" / "2> err.txt"
                pending_redirect = True
            continue
        if pending_redirect:
            pending_redirect = False
            continue
        commands[-1][-1].append(word)
    return [[stage for stage in cmd if stage] for cmd in commands if any(cmd)]


def _strip_wrappers(stage: list[str]) -> list[str]:
    argv = list(stage)
    for _ in range(16):  # wrappers nest (sudo env X=1 nice -n 5 cmd); bounded, never loops
        while argv and (_ASSIGNMENT.match(argv[0]) or argv[0] in _SHELL_WORDS):
            argv.pop(0)
        if not argv:
            return argv
        name = os.path.basename(argv[0])
        if name in _WRAPPERS:
            argv = _skip_options(argv[1:], _WRAPPER_VALUE_OPTS.get(name, frozenset()))
            argv = argv[_WRAPPERS[name] :] if len(argv) > _WRAPPERS[name] else []
            continue
        runner = _RUNNERS.get(name)
        if runner is not None:
            rest = _skip_options(argv[1:], _RUNNER_VALUE_OPTS)
            if "" in runner:
                argv = rest
                continue
            if rest and rest[0] in runner:
                argv = _skip_options(rest[1:], _RUNNER_VALUE_OPTS)
                continue
            if len(rest) > 1 and f"{rest[0]} {rest[1]}" in runner:
                argv = _skip_options(rest[2:], _RUNNER_VALUE_OPTS)
                continue
            return argv
        if _PYTHON.fullmatch(name):
            module = _python_module(argv[1:])
            if module is not None:
                return module
        return argv
    return argv


def _skip_options(args: list[str], value_opts: frozenset[str]) -> list[str]:
    i = 0
    while i < len(args) and args[i].startswith("-") and args[i] != "-":
        if args[i] == "--":
            return args[i + 1 :]
        i += 2 if args[i] in value_opts else 1
    while i < len(args) and _ASSIGNMENT.match(args[i]):
        i += 1  # env VAR=1 cmd
    return args[i:]


def _python_module(args: list[str]) -> list[str] | None:
    """``python [-X opt] [-u] -m module args`` -> ``[module, args...]``."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "-m" and i + 1 < len(args):
            return [args[i + 1], *args[i + 2 :]]
        if arg.startswith("-m") and len(arg) > 2:
            return [arg[2:], *args[i + 1 :]]
        if arg in ("-X", "-W", "-Q"):
            i += 2
            continue
        if arg.startswith("-") and arg != "-":
            i += 1
            continue
        return None
    return None


def _normalized(argv: list[str]) -> tuple[str, ...]:
    if not argv:
        return ()
    program = os.path.basename(argv[0]) or argv[0]
    if "@" in program[1:]:
        program = program[0] + program[1:].split("@", 1)[0]  # npx pnpm@9 -> pnpm
    return (program, *argv[1:])


def _shell_script(argv: list[str]) -> str | None:
    """The script of ``sh -c SCRIPT`` (any option cluster holding ``c``: ``-lc``, ``-ec``),
    or None when ``argv`` is not a shell running a script given on its command line."""
    if not argv or os.path.basename(argv[0]) not in _SHELLS:
        return None
    i, wants_script = 1, False
    while i < len(argv):
        arg = argv[i]
        if arg in _SHELL_VALUE_OPTS:
            i += 2
            continue
        if arg == "--":
            i += 1
            break
        if arg in ("-c", "--command") or (len(arg) > 1 and arg[0] == "-" and arg[1] != "-" and "c" in arg[1:]):
            wants_script = True
        elif not (arg.startswith(("-", "+")) and len(arg) > 1):
            break
        i += 1
    return argv[i] if wants_script and i < len(argv) else None


def parse_command(command: str, _depth: int = 0) -> CommandLine | None:
    """The command whose output ends ``command``'s result, or None for an empty line."""
    if not isinstance(command, str) or not command.strip():
        return None
    try:
        words = _words(command)
    except ValueError:
        words = _fallback_words(command)
    commands = _split(words)
    while commands:
        pipeline = [_strip_wrappers(stage) for stage in commands[-1]]
        pipeline = [stage for stage in pipeline if stage]
        if not pipeline:
            commands.pop()
            continue
        last = os.path.basename(pipeline[-1][0])
        if len(pipeline) == 1 and last in _REPORTING and len(commands) > 1:
            commands.pop()
            continue
        if len(pipeline) == 1:
            producer, piped = pipeline[0], False
        else:
            later = {os.path.basename(stage[0]) for stage in pipeline[1:]}
            producer = pipeline[0] if later <= _TRANSPARENT else pipeline[-1]
            piped = True
        script = _shell_script(producer) if _depth < _MAX_SHELL_DEPTH else None
        inner = parse_command(script, _depth + 1) if script is not None else None
        if inner is not None:
            return CommandLine(inner.argv, piped=piped or inner.piped)
        return CommandLine(_normalized(producer), piped=piped)
    return None


# Global options that take a value, per program: skipped when looking for the subcommand, so
# that `git -C repo status` is `git status`.
GLOBAL_VALUE_OPTIONS: dict[str, frozenset[str]] = {
    "git": frozenset(
        {
            "-C",
            "-c",
            "--git-dir",
            "--work-tree",
            "--namespace",
            "--exec-path",
            "--config-env",
            "--super-prefix",
        }
    ),
    "docker": frozenset(
        {
            "-H",
            "--host",
            "-c",
            "--context",
            "--config",
            "-l",
            "--log-level",
            "--tlscacert",
            "--tlscert",
            "--tlskey",
        }
    ),
    "cargo": frozenset({"-Z", "--config", "-C", "--color"}),
    "npm": frozenset({"--prefix", "-C", "-w", "--workspace"}),
    "pnpm": frozenset({"-C", "--dir", "--filter", "-F", "--workspace-dir"}),
    "yarn": frozenset({"--cwd"}),
    "pip": frozenset({"--python", "--log", "--proxy", "--cert", "--timeout", "--retries"}),
    "make": frozenset({"-C", "-f", "--file", "--directory", "-j", "--jobs", "-l", "-o", "-W"}),
    "kubectl": frozenset({"-n", "--namespace", "--context", "--kubeconfig", "-s", "--server"}),
}


def positionals(argv: tuple[str, ...]) -> list[str]:
    """The non-option arguments after the program (the subcommand comes first)."""
    value_opts = GLOBAL_VALUE_OPTIONS.get(argv[0] if argv else "", frozenset())
    out: list[str] = []
    i = 1
    seen_subcommand = False
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            out.extend(argv[i + 1 :])
            break
        if (arg.startswith("-") and arg != "-") or arg.startswith("+"):
            # Before the subcommand, a global option may take the next word as its value.
            i += 2 if (not seen_subcommand and arg in value_opts) else 1
            continue
        out.append(arg)
        seen_subcommand = True
        i += 1
    return out
