"""Regenerate rules/examples/agent-session.json: a coding-agent session whose tool results are
the real outputs of commands run on a small project made on the spot (nothing hand-written
except the user and assistant turns).

    python tests/tools/make_example_session.py /tmp/exproj > rules/examples/agent-session.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def sh(cmd: str, cwd: Path) -> str:
    proc = subprocess.run(
        cmd,
        shell=True,
        cwd=cwd,
        capture_output=True,
        text=True,
        env={"PATH": os.environ["PATH"], "PYTHONPATH": "src", "HOME": "/tmp", "COLUMNS": "100"},
    )
    out = proc.stdout + proc.stderr
    return out + (f"\nExit code {proc.returncode}" if proc.returncode else "")


def main() -> None:
    root = Path(sys.argv[1])
    messages: list[dict[str, object]] = [
        {
            "role": "system",
            "content": "You are a coding agent working in the repository at /work/inventory. "
            "Use the tools to inspect and change files; run the tests before you finish.",
        },
        {
            "role": "user",
            "content": "The inventory total looks wrong in production. Find out why "
            "src/inventory/stock.py miscounts and fix it; keep the tests green.",
        },
    ]
    n = 0

    def step(text: str, tool: str, args: dict[str, str], output: str) -> None:
        nonlocal n
        n += 1
        cid = f"call_{n:03d}"
        messages.append(
            {
                "role": "assistant",
                "content": text,
                "tool_calls": [
                    {"id": cid, "type": "function", "function": {"name": tool, "arguments": json.dumps(args)}}
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": cid, "content": output})

    step(
        "Let me look at the repository first.",
        "Bash",
        {"command": "git log --stat -5 && ls -R"},
        sh("git log --stat -5 && ls -R", root),
    )
    step(
        "Now the module.",
        "Read",
        {"file_path": "src/inventory/stock.py"},
        (root / "src/inventory/stock.py").read_text(),
    )
    step(
        "Running the test suite to see the failure.",
        "Bash",
        {"command": "python -m pytest -v"},
        sh("python -m pytest -v -p no:cacheprovider", root),
    )
    step(
        "Checking which Python packages are installed, in case of a version issue.",
        "Bash",
        {"command": "python -m pip list --format=columns"},
        sh("python -m pip list --format=columns", root),
    )
    step(
        "Looking for other callers of total() in the standard library checkout for comparison.",
        "Bash",
        {"command": "grep -rn 'def total' /usr/lib/python3*/ | head -400"},
        sh(
            "grep -rn 'def total' /usr/lib/python3*/ /root/.pyenv/versions/3.11.7/lib/python3.11/ "
            "2>/dev/null | head -400",
            root,
        ),
    )
    step(
        "The bug is the `+ 1` in total(). Fixing it.",
        "Edit",
        {
            "file_path": "src/inventory/stock.py",
            "old_string": "sum(self.items.values()) + 1",
            "new_string": "sum(self.items.values())",
        },
        "The file src/inventory/stock.py has been updated.",
    )
    (root / "src/inventory/stock.py").write_text(
        (root / "src/inventory/stock.py")
        .read_text()
        .replace("sum(self.items.values()) + 1", "sum(self.items.values())")
    )
    step(
        "Re-running the tests.",
        "Bash",
        {"command": "python -m pytest -q"},
        sh("python -m pytest -q -p no:cacheprovider", root),
    )
    step("Showing the change.", "Bash", {"command": "git diff"}, sh("git diff", root))
    messages.append(
        {"role": "assistant", "content": "Fixed: `Stock.total()` added 1 to the sum. All 42 tests pass now."}
    )
    messages.append(
        {
            "role": "user",
            "content": "Thanks. Also make remove() reject a negative qty, like add() does, and add a test for it.",
        }
    )
    json.dump(messages, sys.stdout, indent=1, ensure_ascii=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
