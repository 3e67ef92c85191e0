"""The interactive shell: the one `rebuno dev` opens on a terminal beside the kernel it
started (§18.3), and `rebuno repl`, attached to a kernel that runs elsewhere. Agents,
executions, steps and approvals, driven over HTTP through the SDK `Client` exactly as any
other client would.

The shell owns the main thread, the only one Ctrl-C reaches, and runs each command on its own
event loop; a kernel of `rebuno dev` serves from another thread meanwhile, and its log lines
are printed above the prompt, which is then drawn again with what was typed. Ctrl-C clears a
line being typed, interrupts a running command (`exec watch`, `exec stream`), and on an empty
line stops, as Ctrl-D, `quit` and `exit` do. Imports the SDK and the CLI's own modules;
nothing of the kernel.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import readline
import shlex
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from rebuno.cli import approvals, operations, steps
from rebuno.cli.admin import AdminClient, InputError
from rebuno.cli.render import Output
from rebuno.sdk.errors import RebunoError

PROMPT = "rebuno> "
HISTORY_FILE = "~/.rebuno_repl_history"
HISTORY_LENGTH = 1000
APPROVAL_STATUSES = ("pending", "granted", "denied", "expired", "all")

HELP = """\
agents                               list agents (also: agent ls)
agent get <id>                       show an agent and its policy
agent add <manifest.yaml>            register the agents of a manifest
agent rm <id>                        delete an agent
exec                                 list the newest executions (also: exec ls)
exec create <agent> [json]           start an execution; the input defaults to {}
exec get <id>                        status, output and failure
exec watch <id>                      follow the event log until the execution ends
exec events <id>                     the whole event log with payloads
exec steps <id>                      the steps, with one-line arguments and outcomes
exec step <id> <step>                one step in full: arguments, result, error
exec stream <id>                     live output deltas until the execution ends
exec cancel <id>                     cancel an execution
approvals [status]                   pending approvals (or: granted, denied, expired, all)
approval get <id>                    an approval in full: step, arguments, rule, expiry
approval grant <id> [--by NAME] [--rationale TEXT]
approval deny <id> [--by NAME] [--rationale TEXT]
help, ?                              this list
quit, exit                           {quit} (also Ctrl-D, or Ctrl-C on an empty line)

Ids may be shortened to a unique prefix; Ctrl-C interrupts watch and stream."""

_NOUNS = {
    "agent": "agent",
    "agents": "agent",
    "exec": "exec",
    "execution": "exec",
    "executions": "exec",
    "approval": "approval",
    "approvals": "approval",
}
_VERBS = {"list": "ls", "delete": "rm", "remove": "rm"}
_COMPLETIONS = (
    "agent",
    "agents",
    "exec",
    "approvals",
    "approval",
    "help",
    "quit",
    "exit",
    "ls",
    "get",
    "add",
    "rm",
    "create",
    "watch",
    "events",
    "steps",
    "step",
    "stream",
    "cancel",
    "grant",
    "deny",
)


class Stop(BaseException):
    """Raised by the SIGTERM handler: leave the shell and stop the kernel."""


def split_word(text: str) -> tuple[str, str]:
    """The first whitespace-separated word and the rest of the line, stripped."""
    parts = text.strip().split(maxsplit=1)
    if not parts:
        return "", ""
    return parts[0], parts[1] if len(parts) > 1 else ""


def parse_flags(text: str, names: tuple[str, ...]) -> tuple[list[str], dict[str, str]]:
    """Shell-like words into positionals and `--name VALUE` / `--name=VALUE` options."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    positional: list[str] = []
    options: dict[str, str] = {}
    while words:
        word = words.pop(0)
        name, equals, value = word.partition("=")
        if not name.startswith("--"):
            positional.append(word)
        elif name[2:] not in names:
            raise InputError(
                f"unknown option {name} (expected {', '.join('--' + n for n in names)})"
            )
        elif equals:
            options[name[2:]] = value
        elif words:
            options[name[2:]] = words.pop(0)
        else:
            raise InputError(f"{name} needs a value")
    return positional, options


class Repl:
    """Reads commands until the user stops; `run_command` runs one line (False: stop)."""

    def __init__(
        self,
        client: AdminClient,
        out: Output,
        runner: asyncio.Runner,
        *,
        kernel_alive: Callable[[], bool] = lambda: True,
        attached: bool = False,
    ) -> None:
        self._client = client
        self._out = out
        self._runner = runner
        self._kernel_alive = kernel_alive
        self._help = HELP.replace("{quit}", "leave the shell" if attached else "stop the kernel")
        self._line_at_interrupt = ""
        self.reading = False
        """True while the shell waits at its prompt (see `PromptStream`)."""

    def run(self, history: Path | None = None) -> None:
        _answer_interrupts()
        _load_history(history)
        try:
            while self._kernel_alive():
                line = self._read()
                if line is None or not self.run_command(line):
                    return
            self._out.line(self._out.style("the kernel stopped", "red"))
        finally:
            _save_history(history)

    def _read(self) -> str | None:
        """One line; None to stop (Ctrl-D, or Ctrl-C on an empty line)."""
        while True:
            previous = signal.signal(signal.SIGINT, self._interrupted)
            self.reading = True
            try:
                return input(PROMPT)
            except EOFError:
                self._out.line()
                return None
            except KeyboardInterrupt:
                self._out.line()
                if not self._line_at_interrupt.strip():
                    return None
            finally:
                self.reading = False
                signal.signal(signal.SIGINT, previous)

    def _interrupted(self, signum: int, frame: FrameType | None) -> None:
        # readline clears its buffer once the interrupt unwinds: read it while it is typed.
        self._line_at_interrupt = readline.get_line_buffer()
        raise KeyboardInterrupt

    def run_command(self, line: str) -> bool:
        word, rest = split_word(line)
        if not word:
            return True
        if word in ("quit", "exit"):
            return False
        if word in ("help", "?"):
            self._out.line(self._help)
            return True
        noun = _NOUNS.get(word)
        if noun is None:
            self._error(f"unknown command {word!r}; type help")
            return True
        self._guarded(lambda: self._dispatch(noun, rest))
        return True

    def _guarded(self, build: Callable[[], Coroutine[Any, Any, None]]) -> None:
        try:
            self._runner.run(build())
        except KeyboardInterrupt:
            self._out.line(self._out.style("interrupted", "dim"))
        except (RebunoError, InputError) as exc:
            self._error(operations.error_message(exc))

    def _error(self, message: str) -> None:
        self._out.line(self._out.style(f"error: {message}", "red"))

    def _dispatch(self, noun: str, rest: str) -> Coroutine[Any, Any, None]:
        verb, args = split_word(rest)
        verb = _VERBS.get(verb, verb or "ls")
        handler = getattr(self, f"_{noun}_{verb}", None)
        if handler is None:
            return _fail(f"unknown command {noun} {verb!r}; type help")
        result: Coroutine[Any, Any, None] = handler(args)
        return result

    # -- agents --------------------------------------------------------------------------

    def _agent_ls(self, args: str) -> Awaitable[None]:
        return operations.list_agents(self._client, self._out)

    def _agent_get(self, args: str) -> Awaitable[None]:
        return operations.show_agent(self._client, self._out, _one(args, "agent get <id>"))

    def _agent_add(self, args: str) -> Awaitable[None]:
        path = str(Path(_one(args, "agent add <manifest.yaml>")).expanduser())
        return operations.add_agents(self._client, self._out, path)

    def _agent_rm(self, args: str) -> Awaitable[None]:
        return operations.remove_agent(self._client, self._out, _one(args, "agent rm <id>"))

    # -- executions ----------------------------------------------------------------------

    def _exec_ls(self, args: str) -> Awaitable[None]:
        _, options = parse_flags(args, ("agent", "status"))
        return operations.list_executions(
            self._client,
            self._out,
            agent_id=options.get("agent", ""),
            status=options.get("status", ""),
        )

    def _exec_create(self, args: str) -> Awaitable[None]:
        agent_id, raw = split_word(args)
        if not agent_id:
            raise InputError("usage: exec create <agent> [json]")
        try:
            value = json.loads(raw) if raw else {}
        except json.JSONDecodeError as exc:
            raise InputError(f"the input is not valid JSON: {exc}") from None
        return operations.create_execution(self._client, self._out, agent_id, value)

    def _exec_get(self, args: str) -> Awaitable[None]:
        return operations.show_execution(self._client, self._out, _one(args, "exec get <id>"))

    def _exec_watch(self, args: str) -> Awaitable[Any]:
        return operations.watch_execution(self._client, self._out, _one(args, "exec watch <id>"))

    def _exec_events(self, args: str) -> Awaitable[None]:
        return operations.show_events(self._client, self._out, _one(args, "exec events <id>"))

    def _exec_stream(self, args: str) -> Awaitable[None]:
        ident = _one(args, "exec stream <id>")
        return operations.stream_execution(self._client, self._out, ident)

    def _exec_steps(self, args: str) -> Awaitable[None]:
        return steps.list_steps(self._client, self._out, _one(args, "exec steps <id>"))

    def _exec_step(self, args: str) -> Awaitable[None]:
        words = args.split()
        if len(words) != 2:
            raise InputError("usage: exec step <id> <step>")
        return steps.show_step(self._client, self._out, words[0], words[1])

    def _exec_cancel(self, args: str) -> Awaitable[None]:
        ident = _one(args, "exec cancel <id>")
        return operations.cancel_execution(self._client, self._out, ident)

    # -- approvals -----------------------------------------------------------------------

    def _approval_ls(self, args: str) -> Awaitable[None]:
        positional, options = parse_flags(args, ("execution",))
        status = positional[0] if positional else "pending"
        if status not in APPROVAL_STATUSES:
            raise InputError(f"unknown status {status!r} ({', '.join(APPROVAL_STATUSES)})")
        return approvals.list_approvals(
            self._client, self._out, status=status, execution=options.get("execution", "")
        )

    def _approval_get(self, args: str) -> Awaitable[None]:
        ident = _one(args, "approval get <id>")
        return approvals.show_approval(self._client, self._out, ident)

    def _approval_grant(self, args: str) -> Awaitable[None]:
        return self._decide(args, grant=True)

    def _approval_deny(self, args: str) -> Awaitable[None]:
        return self._decide(args, grant=False)

    def _decide(self, args: str, *, grant: bool) -> Awaitable[None]:
        verb = "grant" if grant else "deny"
        positional, options = parse_flags(args, ("by", "rationale"))
        if len(positional) != 1:
            raise InputError(f"usage: approval {verb} <id> [--by NAME] [--rationale TEXT]")
        return approvals.decide_approval(
            self._client,
            self._out,
            positional[0],
            grant=grant,
            decided_by=options.get("by", ""),
            rationale=options.get("rationale", ""),
        )


def _one(args: str, usage: str) -> str:
    words = args.split()
    if len(words) != 1:
        raise InputError(f"usage: {usage}")
    return words[0]


async def _fail(message: str) -> None:
    raise InputError(message)


def _complete(text: str, state: int) -> str | None:
    matches = [word + " " for word in _COMPLETIONS if word.startswith(text)]
    return matches[state] if state < len(matches) else None


def _load_history(path: Path | None) -> None:
    readline.set_completer(_complete)
    readline.parse_and_bind("tab: complete")
    readline.set_history_length(HISTORY_LENGTH)
    if path is not None and path.exists():
        # An unreadable history only costs the user their recall.
        with contextlib.suppress(OSError):
            readline.read_history_file(path)


def _save_history(path: Path | None) -> None:
    if path is None:
        return
    # A read-only home directory must not turn quitting into an error.
    with contextlib.suppress(OSError):
        readline.write_history_file(path)


class PromptStream:
    """Stands in for a terminal stream under the log handlers while the shell runs: a line
    logged while the shell waits at its prompt clears the prompt's line, is printed there, and
    the prompt is drawn again below it with what had been typed, so typing goes on undisturbed.

    Writes come from the kernel's thread; the handler's lock keeps them whole, and the typed
    text is only read, so the shell's own line editing is never touched.
    """

    def __init__(self, stream: TextIO, repl: Repl) -> None:
        self._stream = stream
        self._repl = repl

    def write(self, text: str) -> int:
        if not self._repl.reading:
            return self._stream.write(text)
        typed = readline.get_line_buffer()
        self._stream.write(_CLEAR_LINE + text)
        if text.endswith("\n"):
            self._stream.write(PROMPT + typed)
        return len(text)

    def flush(self) -> None:
        self._stream.flush()


_CLEAR_LINE = "\r\033[K"


@contextlib.contextmanager
def logs_above_prompt(repl: Repl, stream: TextIO) -> Iterator[None]:
    """While the shell runs, the root log handlers that write to `stream` (a terminal) go
    through a `PromptStream`; afterwards they write to `stream` again."""
    handlers = [
        handler
        for handler in logging.getLogger().handlers
        if isinstance(handler, logging.StreamHandler) and handler.stream is stream
    ]
    if not stream.isatty():
        handlers = []
    guarded = PromptStream(stream, repl)
    for handler in handlers:
        handler.setStream(guarded)
    try:
        yield
    finally:
        for handler in handlers:
            handler.setStream(stream)


def start(
    url: str,
    *,
    api_key: str = "",
    kernel_alive: Callable[[], bool] = lambda: True,
    attached: bool = False,
) -> None:
    """Runs the shell against the kernel at `url` until the user stops it.

    `attached`: the kernel runs elsewhere (`rebuno repl`); it is asked for one execution first,
    so an unreachable kernel or a refused key fails at once, and quitting leaves it running.

    Raises:
        RebunoError: an attached kernel cannot be reached or refuses the key.
    """
    out = Output.to()
    previous = signal.signal(signal.SIGTERM, _stop)
    with asyncio.Runner() as runner:
        client = AdminClient(url, api_key=api_key)
        try:
            if attached:
                runner.run(client.list(limit=1))
            shell = Repl(client, out, runner, kernel_alive=kernel_alive, attached=attached)
            out.line(_banner(url, attached))
            with logs_above_prompt(shell, sys.stderr):
                shell.run(Path(HISTORY_FILE).expanduser())
        except Stop:
            out.line()
        finally:
            signal.signal(signal.SIGTERM, previous)
            runner.run(client.close())


def _banner(url: str, attached: bool) -> str:
    if attached:
        return f"rebuno kernel at {url}; type help, or quit to leave (the kernel keeps running)"
    return f"rebuno kernel on {url}; type help, or quit to stop it"


def _stop(signum: int, frame: FrameType | None) -> None:
    raise Stop


def _answer_interrupts() -> None:
    """Ctrl-C reaches the shell whatever the process inherited: a parent that ignored SIGINT
    or blocked it passes that on to its children, and the shell would then never see one."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.default_int_handler)
