"""Optional sampling profiles of the kernel and the agent with py-spy (not a dependency of the
project: install it yourself to use `--profile`), and their summary: the top functions by self
time and by inclusive time, from py-spy's raw (collapsed-stack) output.

Run `python -m bench.profiles FILE.txt [N]` to print the summary of one profile. Standard
library only.
"""

from __future__ import annotations

import itertools
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


def py_spy() -> str | None:
    """The py-spy executable beside this interpreter or on PATH, if any."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


class Profiler:
    """Records each named pid with py-spy into `<target>-<name>.txt` while the block runs."""

    def __init__(self, pids: dict[str, int], target: Path, rate: int = 200) -> None:
        self._pids = pids
        self._target = target
        self._rate = rate
        self._procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Profiler:
        executable = py_spy()
        if executable is None:
            raise RuntimeError("--profile needs py-spy: pip install py-spy into the venv")
        self._target.parent.mkdir(parents=True, exist_ok=True)
        for name, pid in self._pids.items():
            output = f"{self._target}-{name}.txt"
            args = [executable, "record", "-p", str(pid), "-f", "raw", "-o", output]
            args += ["--function", "--nonblocking", "-r", str(self._rate)]
            self._procs.append(
                subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            )
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self._procs:
            proc.send_signal(signal.SIGINT)
        for proc in self._procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


@dataclass(frozen=True, slots=True)
class Summary:
    samples: int
    self_time: list[tuple[str, int]]
    inclusive: list[tuple[str, int]]

    def render(self) -> str:
        lines = [f"{self.samples} samples"]
        for title, rows in (("self", self.self_time), ("inclusive", self.inclusive)):
            lines.append(f"top {len(rows)} by {title} time:")
            for frame, count in rows:
                lines.append(f"  {count / self.samples:6.1%}  {frame}")
        return "\n".join(lines)


def summarize(path: Path, top: int = 15) -> Summary:
    """Top `top` frames by self samples and by inclusive samples (a frame counted once per
    stack however often it recurs). Pass-through frames (no self time, one callee: `main`,
    click, runpy, middleware chains) are left out of the inclusive list, so it starts where
    the work branches."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    callees: dict[str, set[str]] = {}
    total = 0
    for stack, count in _stacks(path):
        total += count
        own[stack[-1]] += count
        for frame in set(stack):
            inclusive[frame] += count
        for caller, callee in itertools.pairwise(stack):
            callees.setdefault(caller, set()).add(callee)
    passing = {frame for frame, called in callees.items() if len(called) == 1 and not own[frame]}
    branching = Counter({f: n for f, n in inclusive.items() if f not in passing})
    return Summary(total, own.most_common(top), branching.most_common(top))


def _stacks(path: Path) -> Iterator[tuple[list[str], int]]:
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            yield stack.split(";"), int(count)


def main(argv: list[str]) -> None:
    top = int(argv[1]) if len(argv) > 1 else 15
    print(summarize(Path(argv[0]), top).render())


if __name__ == "__main__":
    main(sys.argv[1:])
