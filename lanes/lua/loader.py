"""Loads the Lua scripts (each ``<name>.lua``, its ``--! include`` lines filled in, prefixed with the
``lanes.keys`` constants (``prelude``) and ``_lib.lua`` blocks it uses) and runs them.

Each EVALSHA runs a script's top level again, which re-creates every ``local function`` closure ahead of
its body: prelude + the whole ``_lib.lua`` cost about 46K instructions a call (callgrind). So a script carries only the
``_lib.lua`` blocks (top-level ``local function NAME(`` / ``local NAME =``) and constants it names,
transitively, in their order (``select_lib``): its text is a subset of prelude + ``_lib.lua`` + body. What only a
rare path needs can be made only by a call that takes it (``LAZY``: admit.lua's refusals, limits, debounce).

The scripts live beside this module, each with one typed Python wrapper
(``lanes/lua/admit.py`` for ``admit.lua``, ...): the wrapper is the only code
that knows the order of a script's KEYS and ARGV; callers pass named values.
A script kept elsewhere (the load-test sink's) is loaded from its own
``directory``, with the same ``_lib.lua`` prefix if it has one there.

redis-py's ``Script`` runs a script by SHA and loads it again on ``NOSCRIPT``
(after a Redis restart or ``SCRIPT FLUSH``), so each is sent whole only once
per server.
"""

from __future__ import annotations

import os
import re
from collections import deque
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

from redis.commands.core import Script
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from lanes import keys
from lanes.forksafe import ForkSafeLock
from lanes.redis_client import get_redis

SCRIPT_DIR = Path(__file__).parent


#: A script's line naming a file of the same folder whose text takes its place
#: (``--! include _admit.lua``): code two scripts share beyond ``_lib.lua``.
INCLUDE = "--! include "


def prelude() -> str:
    """``lanes.keys``' constants that the scripts use (``keys.LUA_CONSTANTS``), as Lua locals of the same
    names: one source for a key's suffix, in Python and in Lua."""
    lines = []
    for name in keys.LUA_CONSTANTS:
        value = getattr(keys, name)
        if not isinstance(value, str) or not _LUA_PLAIN.fullmatch(value):
            raise ValueError(f"lanes.keys.{name} = {value!r} cannot be written as a plain Lua string")
        lines.append(f"local {name} = '{value}'\n")
    return "".join(lines)


_LUA_PLAIN = re.compile(r"[A-Za-z0-9_.:{}-]*")


class LibBlock(NamedTuple):
    """One top-level definition of ``_lib.lua`` (or a prelude constant): its text (with the comment
    lines just above it) and the names of other blocks its code uses."""

    name: str
    text: str
    uses: frozenset[str]


#: A Lua token the name scan must skip whole (a comment or a string: a name inside is no use of it),
#: or a name.
_LUA_TOKEN = re.compile(
    r"""--\[(?P<ceq>=*)\[.*?\](?P=ceq)\]
      | --[^\n]*
      | \[(?P<seq>=*)\[.*?\](?P=seq)\]
      | '(?:\\.|[^'\\\n])*'
      | "(?:\\.|[^"\\\n])*"
      | (?P<name>[A-Za-z_][A-Za-z0-9_]*)""",
    re.S | re.X,
)

_BLOCK_HEAD = re.compile(r"local (?:function )?([A-Za-z_][A-Za-z0-9_]*)\b")


def lua_names(code: str) -> set[str]:
    """The names ``code`` mentions outside its comments and strings (fields and locals too: a superset
    of what it uses, so a block is kept whenever it may be needed)."""
    return {found["name"] for found in _LUA_TOKEN.finditer(code) if found["name"]}


def parse_lib(text: str) -> tuple[str, list[LibBlock]]:
    """``_lib.lua`` as its header comment and its top-level blocks, in order.

    A block starts at a line ``local function NAME(`` or ``local NAME =`` at column 0 (with the comment
    and blank lines right above it) and runs to the next; any other code at column 0 but a function's
    closing ``end`` is refused, so that nothing is silently lost or misplaced. Comment lines after the
    last block are left out."""
    header: list[str] = []
    pending: list[str] = []
    blocks: list[tuple[str, list[str]]] = []
    open_function = False
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        code = line.strip()
        head = _BLOCK_HEAD.match(line)
        if head:
            blocks.append((head[1], [*pending, line]))
            pending, open_function = [], line.startswith("local function ")
        elif open_function and (line[:1].isspace() or code.startswith("--") or not code):
            blocks[-1][1].append(line)
        elif open_function and line.rstrip() == "end":
            blocks[-1][1].append(line)
            open_function = False
        elif not code or (code.startswith("--") and not line[:1].isspace()):
            (pending if blocks else header).append(line)
        else:
            raise ValueError(f"_lib.lua line {number}: top-level code outside a local block: {line!r}")
    names = [name for name, _ in blocks]
    if len(set(names)) != len(names):
        raise ValueError(f"_lib.lua defines a name twice: {sorted(n for n in names if names.count(n) > 1)}")
    defined = set(names) | set(keys.LUA_CONSTANTS)
    lib = [LibBlock(name, "".join(lines), frozenset(lua_names("".join(lines)) & defined - {name}))
           for name, lines in blocks]
    return "".join(header), lib


def select_lib(blocks: Sequence[LibBlock], body: str) -> list[LibBlock]:
    """The blocks ``body`` uses, and those they use (transitively), in their order."""
    by_name = {block.name: block for block in blocks}
    wanted: set[str] = set()
    todo = [name for name in lua_names(body) if name in by_name]
    while todo:
        name = todo.pop()
        if name not in wanted:
            wanted.add(name)
            todo += [used for used in by_name[name].uses - wanted if used in by_name]
    return [block for block in blocks if block.name in wanted]


def _prelude_blocks() -> list[LibBlock]:
    return [LibBlock(name, line, frozenset())
            for name, line in zip(keys.LUA_CONSTANTS, prelude().splitlines(keepends=True), strict=True)]


def _expanded(text: str, folder: Path) -> str:
    """``text`` with each ``--! include`` line replaced by the file it names."""
    return "".join(
        (folder / line[len(INCLUDE):].strip()).read_text() + "\n" if line.startswith(INCLUDE) else line
        for line in text.splitlines(keepends=True)
    )


def _body(name: str, folder: Path) -> str:
    return _expanded((folder / f"{name}.lua").read_text(), folder)


#: A script's line ``--! lazy _file.lua as NAME``: the file's code (its includes filled in) and the ``_lib.lua``
#: blocks and constants only it uses go inside ``local function NAME()``, which makes them at its first call in a
#: script call and returns the file's top-level functions by name (``NAME().fn(...)``). Lua makes every
#: ``local function`` of a script again at each call (a closure, and an upvalue for each local it names: about
#: 110K of admit.lua's 253K instructions for a plain item, docs/redis-budget.md); what only a rare path needs
#: is then made only by a call that takes that path.
LAZY = re.compile(r"^--! lazy (?P<file>\S+) as (?P<name>[A-Za-z_][A-Za-z0-9_]*)[ \t]*\n", re.M)
#: The first and last lines of a lazy section as loaded (tests cut the section out by them).
LAZY_BEGIN = "local function {name}()  --! lazy {file}\n"
LAZY_END = "end  --! end lazy {name}\n"
_TOP_FUNCTION = re.compile(r"^local function ([A-Za-z_][A-Za-z0-9_]*)\(", re.M)


class LazySection(NamedTuple):
    """One ``--! lazy`` line of a script's body: the line, the function's name, its file and the file's code."""

    line: str
    name: str
    file: str
    text: str


def lazy_sections(body: str, folder: Path) -> list[LazySection]:
    """The ``--! lazy`` sections of a script's ``body`` (``_body``), in order."""
    return [LazySection(found[0], found["name"], found["file"], _expanded((folder / found["file"]).read_text(),
                                                                          folder))
            for found in LAZY.finditer(body)]


def _lazy_text(section: LazySection, blocks: list[LibBlock]) -> str:
    """The function a lazy section becomes, with ``blocks`` (its constants first) inside it."""
    exports = ", ".join(f"{fn} = {fn}" for fn in _TOP_FUNCTION.findall(section.text))
    constants = "".join(block.text for block in blocks if block.name in keys.LUA_CONSTANTS)
    functions = "".join(block.text for block in blocks if block.name not in keys.LUA_CONSTANTS)
    return (f"local {section.name}_made = nil\n" + LAZY_BEGIN.format(name=section.name, file=section.file)
            + f"  if {section.name}_made then return {section.name}_made end\n"
            + constants + functions + "\n" + section.text
            + f"  {section.name}_made = {{{exports}}}\n  return {section.name}_made\n"
            + LAZY_END.format(name=section.name))


def split_lazy(source: str) -> tuple[str, list[str]]:
    """A loaded script's text without its lazy sections' functions, and those functions (each from the ``_made``
    line above its ``LAZY_BEGIN`` to its ``LAZY_END``), in order."""
    found = [match[0] for match in _LAZY_MADE.finditer(source)]
    top = source
    for text in found:
        top = top.replace(text, "", 1)
    return top, found


_LAZY_MADE = re.compile(r"^local (\w+)_made = nil\nlocal function \1\(\)  --! lazy .*?^end  --! end lazy \1\n",
                        re.M | re.S)


@cache
def _source(name: str, directory: Path | None = None) -> str:
    """Script ``name``'s text as loaded: the prelude constants and ``_lib.lua`` blocks it uses, then its body, each
    ``--! lazy`` line replaced by its function (``LAZY``), which holds the blocks and constants only it uses."""
    folder = directory or SCRIPT_DIR
    body = _body(name, folder)
    lib = folder / "_lib.lua"
    header, blocks = parse_lib(lib.read_text()) if lib.exists() else ("", [])
    available = _prelude_blocks() + blocks
    chosen = select_lib(available, body)
    for section in lazy_sections(body, folder):
        inner = [block for block in select_lib(available, section.text) if block not in chosen]
        body = body.replace(section.line, _lazy_text(section, inner), 1)
    constants = "".join(block.text for block in chosen if block.name in keys.LUA_CONSTANTS)
    if not lib.exists():
        return constants + body
    return constants + header + "".join(block.text for block in chosen if block.name not in keys.LUA_CONSTANTS) \
        + "\n" + body


_scripts: dict[tuple[int, str, Path | None], Script] = {}


def script(name: str, directory: Path | None = None) -> Script:
    client = get_redis()
    key = (id(client), name, directory)
    found = _scripts.get(key)
    if found is None:
        found = _scripts[key] = client.register_script(_source(name, directory))
    return found


class ReplicaAcksMissing(RedisError):
    """Fewer replicas than asked confirmed a script's write in time: a failover may still lose it."""

    def __init__(self, wanted: int, confirmed: int, timeout_ms: int) -> None:
        super().__init__(f"{confirmed} of {wanted} replicas confirmed the write within {timeout_ms} ms")
        self.wanted, self.confirmed, self.timeout_ms = wanted, confirmed, timeout_ms


def call(name: str, keys: Sequence[Any], args: Sequence[Any], directory: Path | None = None, *,
         replicas: int = 0, replicas_timeout_ms: int = 0, wait_if: Callable[[Any], bool] | None = None) -> Any:
    """Run script ``name`` in one round trip: ``script(name)(keys=keys, args=args)``, leaner.

    For the calls every task makes (start, finish): the command goes straight
    to a pooled connection, without redis-py's per-command layers (a retry
    wrapper that retries nothing here, observability hooks, response callbacks,
    none of which EVALSHA uses); that halves the client's CPU per call. Errors
    are the same: the connection drops itself on a socket error or timeout and
    the error is raised, never re-sent. A Redis that lost the script (restart,
    ``SCRIPT FLUSH``, a replica promoted by Sentinel) gets it by ``EVAL``,
    which loads it again.

    ``replicas`` > 0: then ``WAIT replicas replicas_timeout_ms`` on the same
    connection (so it covers this script's writes), when ``wait_if(reply)`` says
    the reply stands for a write the caller will report; fewer confirmations
    raise ``ReplicaAcksMissing``.
    """
    found = script(name, directory)
    pool = found.registered_client.connection_pool  # type: ignore[union-attr]  # never a cluster client here
    conn = pool.get_connection()
    try:
        conn.send_command("EVALSHA", found.sha, len(keys), *keys, *args)
        try:
            reply = conn.read_response()
        except NoScriptError:
            conn.send_command("EVAL", found.script, len(keys), *keys, *args)
            reply = conn.read_response()
        if replicas > 0 and (wait_if is None or wait_if(reply)):
            conn.send_command("WAIT", replicas, replicas_timeout_ms)
            confirmed = int(conn.read_response())
            if confirmed < replicas:
                raise ReplicaAcksMissing(replicas, confirmed, replicas_timeout_ms)
        return reply
    finally:
        pool.release(conn)


class NotSent(RedisError):
    """A call never sent: the connection had failed before (``cause``). Nothing of it was written."""

    def __init__(self, cause: RedisError) -> None:
        super().__init__(f"not sent: {cause}")
        self.cause = cause


#: (connection pool, script SHA) pairs whose server answered a ``SCRIPT LOAD`` of this process: a
#: ``ScriptStream`` there sends its first batch without one (and again with one on ``NOSCRIPT``).
_loaded_on: set[tuple[int, str]] = set()

#: The connection a ``ScriptStream`` keeps between streams, with its pool (at most one; a stream that finds
#: none, or another's, takes one from the pool): the pool's checkout and return, with redis-py's observability
#: records, were about a tenth of a lone dispatch's CPU. Out of the pool, never shared: one stream at a time.
_kept: list[tuple[Any, Any]] = []
_kept_lock = ForkSafeLock()


def _take_connection(pool: Any) -> Any:
    """A connection of ``pool`` ready to send: the kept one, checked as the pool checks one it hands out
    (connected, with nothing left to read: a server that closed it, a restart, is met here and not by the
    call), else the pool's."""
    with _kept_lock:
        kept = _kept.pop() if _kept else None
    if kept is None or kept[0] is not pool or kept[1].pid != os.getpid():
        if kept is not None:
            kept[0].release(kept[1])  # another client's (a reset), or the parent's before a fork: back to it
        return pool.get_connection()
    conn = kept[1]
    try:
        conn.connect()
        if conn.can_read():
            raise RedisConnectionError("Connection has data")
    except (RedisConnectionError, RedisTimeoutError, OSError):
        try:
            conn.disconnect()
            conn.connect()
            if conn.can_read():
                raise RedisConnectionError("Connection not ready") from None
        except BaseException:
            pool.release(conn)
            raise
    return conn


def _keep_connection(pool: Any, conn: Any) -> None:
    """Keep ``conn`` for the next stream if none is kept and the pool would take it back (after a Sentinel
    failover it would not: the old master's); else return it to the pool, which decides."""
    if pool.owns_connection(conn) and not conn.should_reconnect():
        with _kept_lock:
            if not _kept:
                _kept.append((pool, conn))
                return
    pool.release(conn)


def kept_connections(pool: Any) -> list[Any]:
    """The connections of ``pool`` kept out of it between streams (for the leak check of the tests)."""
    with _kept_lock:
        return [conn for owner, conn in _kept if owner is pool]


class ScriptStream:
    """Calls of one script on one connection, each sent before the last is read.

    So the caller prepares call N+1 while Redis runs call N: one round trip a
    call, and the caller's work overlaps Redis'. One connection keeps the
    order: Redis runs the calls in the order they were sent; it is the one the
    process keeps between streams when free (``_take_connection``). A stream's
    first call goes without ``SCRIPT LOAD`` once this process has seen that
    server load the script, and is read before any other is sent: a
    ``NOSCRIPT`` answer (nothing of it ran) sends it again with ``SCRIPT LOAD``
    ahead (same round trip), as every first call on a server not seen yet
    goes. A stream of one call (a single dispatch) is then one ``EVALSHA``.
    Never raises: ``receive`` gives each call its reply or the ``RedisError``
    it met (a ``ResponseError`` of that call alone; the connection's error for
    every call not yet answered: their outcome is unknown; ``NotSent`` for a
    call not sent because the connection had failed: nothing of it was
    written). Use as a context manager; ``replicas_confirmed`` then ``WAIT``s
    once for every write.
    """

    __slots__ = ("_conn", "_error", "_first", "_in_flight", "_load", "_pool", "_probe", "_ready", "_sha", "_source",
                 "directory", "name")

    def __init__(self, name: str, directory: Path | None = None) -> None:
        self.name, self.directory = name, directory
        self._conn: Any = None
        self._error: RedisError | None = None
        #: The next call goes with SCRIPT LOAD ahead (the server may not have the script).
        self._load = True
        self._first = True
        #: (SCRIPT LOAD reply first, sent) a call sent and not read yet.
        self._in_flight: deque[tuple[bool, bool]] = deque()
        #: The first call, sent without SCRIPT LOAD and not read yet (read before another is sent), then its reply.
        self._probe: Packed | tuple[Sequence[Any], Sequence[Any]] | None = None
        self._ready: Any = _NONE

    def __enter__(self) -> ScriptStream:
        try:
            found = script(self.name, self.directory)
            self._sha, self._source = found.sha, found.script
            self._pool = pool = found.registered_client.connection_pool  # type: ignore[union-attr]  # never a cluster
            self._conn = _take_connection(pool)
            self._load = (id(pool), found.sha) not in _loaded_on
        except RedisError as exc:
            self._error = NotSent(exc)
        except OSError as exc:  # a socket error redis-py did not wrap (its checks before a send)
            self._error = NotSent(RedisConnectionError(f"Error connecting to Redis: {exc}"))
        return self

    def __exit__(self, *exc_info: Any) -> None:
        conn = self._conn
        if conn is not None:
            if self._in_flight or self._error is not None:  # replies left unread, or a failed call: out of step
                conn.disconnect()
            _keep_connection(self._pool, conn)
            self._conn = None

    def send(self, call: Packed | tuple[Sequence[Any], Sequence[Any]]) -> None:
        """Send one call (``Packed``, or its keys and arguments); its reply comes from a later ``receive``."""
        if self._probe is not None:
            self._read_probe()
        if self._first:
            self._first = False
            if not self._load and self._error is None:
                self._probe = call
        self._send(call)

    def _read_probe(self) -> None:
        """Read the first call, sent without SCRIPT LOAD; if the server lost the script, send it again with."""
        call, self._probe = self._probe, None
        reply = self._read()
        if isinstance(reply, NoScriptError):  # nothing of it ran
            _loaded_on.discard((id(self._pool), self._sha))
            self._load = True
            self._send(call)  # type: ignore[arg-type]  # set with the probe
            reply = self._read()
        self._ready = reply

    def _send(self, call: Packed | tuple[Sequence[Any], Sequence[Any]]) -> None:
        load = self._load
        sent = self._error is None
        if sent:
            try:
                # No health check (a PING read) while replies are pending: it would read one of theirs.
                self._conn.send_packed_command(_pack(self._conn, call, self._sha, self._source if load else None),
                                               check_health=not self._in_flight)
                self._load = False
            except RedisError as exc:  # part may have gone out: unknown, like an unanswered call
                self._error = exc
        self._in_flight.append((load and sent, sent))

    def receive(self) -> Any:
        """The reply of the oldest call sent and not yet received (or the ``RedisError`` it met)."""
        if self._probe is not None:
            self._read_probe()
        reply = self._ready
        if reply is not _NONE:
            self._ready = _NONE
            return reply
        return self._read()

    def _read(self) -> Any:
        load, sent = self._in_flight.popleft()
        error = self._error
        if error is not None:
            return NotSent(error) if not sent and not isinstance(error, NotSent) else error
        conn = self._conn
        try:
            if load:
                try:
                    conn.read_response()
                    _loaded_on.add((id(self._pool), self._sha))
                except ResponseError:  # the call then answers NOSCRIPT, its own error
                    pass
            try:
                return conn.read_response()
            except ResponseError as exc:
                return exc
        except RedisError as exc:  # the connection broke (redis-py dropped it): this and the rest are unknown
            self._error = exc
            return exc

    def replicas_confirmed(self, replicas: int, timeout_ms: int) -> RedisError | None:
        """``WAIT replicas timeout_ms`` for every write sent so far; None when enough replicas hold them."""
        if self._probe is not None:
            self._read_probe()
        if self._error is not None:
            return self._error
        try:
            self._conn.send_command("WAIT", replicas, timeout_ms)
            confirmed = int(self._conn.read_response())
        except RedisError as exc:
            self._error = exc
            return exc
        return None if confirmed >= replicas else ReplicaAcksMissing(replicas, confirmed, timeout_ms)


#: ``ScriptStream``'s "no reply kept" (a reply may be None).
_NONE = object()


class Packed:
    """A script call's keys and arguments already in Redis' protocol: ``count`` bulk strings (``resp``), the
    first ``numkeys`` of them keys. For a caller that writes thousands of arguments a call faster than
    packing them one by one (``lanes.lua.admit.packed``); ``ScriptStream.send`` adds the EVALSHA."""

    __slots__ = ("count", "numkeys", "resp")

    def __init__(self, numkeys: int, count: int, resp: bytes) -> None:
        self.numkeys, self.count, self.resp = numkeys, count, resp


def utf8_length(text: str) -> int:
    """``text``'s length in UTF-8 (its ``len`` when ASCII, which ``isascii`` knows without looking)."""
    return len(text) if text.isascii() else len(text.encode())


def bulk_strings(values: Sequence[Any]) -> str:
    """``values`` (str, or int) as Redis protocol bulk strings, as text to be encoded in UTF-8 (with
    ``Packed``): each one's length is its UTF-8 length."""
    out = []
    for value in values:
        text = value if isinstance(value, str) else str(int(value))
        out.append(f"${utf8_length(text)}\r\n{text}\r\n")
    return "".join(out)


def _pack(conn: Any, call: Packed | tuple[Sequence[Any], Sequence[Any]], sha: str, load: str | bytes | memoryview | None
          ) -> list[bytes]:
    """The call's ``EVALSHA`` (``SCRIPT LOAD`` of ``load`` ahead, unless None) in Redis' protocol, as one buffer; a
    ``Packed`` call's head written as text (hiredis, or redis-py without it, packs the rest: redis-py's packing
    costs more than preparing a dispatch)."""
    if isinstance(call, Packed):
        numkeys = str(call.numkeys)
        head = f"*{3 + call.count}\r\n$7\r\nEVALSHA\r\n${len(sha)}\r\n{sha}\r\n${len(numkeys)}\r\n{numkeys}\r\n"
        out = [head.encode(), call.resp]
    else:
        out = _packed(conn, ("EVALSHA", sha, len(call[0]), *call[0], *call[1]))
    if load is not None:
        out = _packed(conn, ("SCRIPT", "LOAD", load)) + out
    return [b"".join(out)]


def _packed(conn: Any, command: tuple[Any, ...]) -> list[bytes]:
    if _pack_command is None:
        return conn.pack_commands([command])
    return [_pack_command(command)]


try:
    from hiredis import pack_command as _pack_command
except ImportError:  # pragma: no cover - hiredis is in requirements.txt; redis-py's own packing serves without it
    _pack_command = None  # type: ignore[assignment]
