"""Bench plans: a YAML file naming one command template and a matrix of values; pure, no torch, no SSH."""

from __future__ import annotations

import itertools
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any

from ddops.errors import PlaybookError, UsageError
from ddops.yamlsrc import YamlDoc, describe, dotted, load_yaml_file, suggest, type_name

SUMMARIZERS = ("ddtree", "vllm", "metrics")
# Names the launcher fills per host or per run; a plan may use them without declaring them.
HOST_BUILTINS = ("gpus", "host", "repo", "python")
RUN_BUILTINS = ("result_dir", "run_index")
# The free port the host's runner picked for the plan's `server:` (remote/ddops_agent/servers.py), known only there.
SERVER_PORT = "server_port"
BUILTINS = HOST_BUILTINS + RUN_BUILTINS + (SERVER_PORT,)

TOP_KEYS: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "description": str,
    "workdir": str,
    "env": dict,
    "command": str,
    "matrix": dict,
    "vars": dict,
    "requires_patches": list,
    "gpus": int,
    "min_free_disk_gb": (int, float),
    "results": str,
    "summarizer": str,
    "timeout_minutes": (int, float),
    "metrics": dict,
    "server": dict,
    # the host's environment and GPUs before a launch (ddops/bench/environment.py, ddops/bench/gpus.py)
    "requires_packages": dict,
    "allow_busy_gpus": bool,
}
# `metrics:` of a plan whose summarizer is `metrics` (ddops/bench/summarize_metrics.py): where each number and the
# output text sit in the team's own JSON or CSV metrics file, as key paths (`a.b.0.c`; a CSV column name).
METRIC_KEYS = ("format", "records", "method", "tokens_per_s", "tpot_s", "ttft_s", "output", "dataset",
               "temperature", "model")
METRIC_FORMATS = ("json", "csv")
REQUIRED = ("command", "results", "summarizer")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")
Scalar = str | int | float | bool
Value = Scalar | tuple[Scalar, ...]


@dataclass(frozen=True, slots=True)
class BenchPlan:
    """A validated bench plan; `matrix` keeps its YAML order, each entry a mapping of placeholder to value."""

    name: str
    command: str
    results: str
    summarizer: str
    path: str = "<plan>"
    description: str = ""
    workdir: str = "."
    env: dict[str, str] = field(default_factory=dict, hash=False)
    matrix: tuple[tuple[str, tuple[dict[str, Value], ...]], ...] = ()
    vars: dict[str, Value | None] = field(default_factory=dict, hash=False)
    requires_patches: tuple[str, ...] = ()
    gpus: int = 0
    min_free_disk_gb: float = 0.0
    timeout_minutes: float = 60.0
    metrics: dict[str, str] = field(default_factory=dict, hash=False)
    server: ServerPlan | None = None
    overrides: dict[str, Value] = field(default_factory=dict, hash=False)  # --var: beat plan and host vars
    requires_packages: tuple[tuple[str, str], ...] = ()  # (distribution, PEP 440 range or "")
    allow_busy_gpus: bool = False

    @property
    def placeholders(self) -> tuple[str, ...]:
        """Every name the command, env and server templates use, in first-use order."""
        seen: dict[str, None] = {}
        server = (self.server.command, *self.server.env.values()) if self.server else ()
        for text in (self.command, *self.env.values(), *server):
            for name in template_names(text):
                seen.setdefault(name)
        return tuple(seen)


@dataclass(frozen=True, slots=True)
class RunSpec:
    """One expanded run: the matrix values it stands for, the shell command and its environment."""

    index: int
    params: dict[str, Value] = field(hash=False)
    command: str = ""
    env: dict[str, str] = field(default_factory=dict, hash=False)
    server: RunServer | None = None

    @property
    def label(self) -> str:
        """`dataset=gsm8k temperature=0.0`: the scalar matrix values, for logs and tables."""
        parts = [f"{k}={_text(v)}" for k, v in self.params.items() if not isinstance(v, tuple)]
        return " ".join(parts) or f"run {self.index}"


# --- servers: a process the runs need (a vLLM server), started by the host's runner and always stopped ------------

SERVER_KEYS: dict[str, type | tuple[type, ...]] = {
    "command": str, "ready": str, "ready_timeout_minutes": (int, float), "version": str, "env": dict, "scope": str,
}
# group: consecutive runs whose server renders alike share one; run: a server of its own for every run.
SERVER_SCOPES = ("group", "run")
READY_TCP = "tcp"
# How `{server_port}` reaches a shell: the runner exports the port it picked under this name.
SERVER_PORT_ENV = "DDOPS_SERVER_PORT"


@dataclass(frozen=True, slots=True)
class ServerPlan:
    """A plan's `server:` as written: templates, the readiness probe and its deadline, how runs share it."""

    command: str
    ready: str = READY_TCP  # an HTTP path answered 2xx on 127.0.0.1:<port>, or `tcp`: the port accepts connections
    ready_timeout_minutes: float = 10.0
    version: str | None = None  # an HTTP path whose answer the manifest keeps as the server's version
    env: dict[str, str] = field(default_factory=dict, hash=False)
    scope: str = "group"


@dataclass(frozen=True, slots=True)
class RunServer:
    """The server one run needs, rendered; runs with the same `group` share one server, started once."""

    group: int
    command: str
    env: dict[str, str] = field(default_factory=dict, hash=False)
    ready: str = READY_TCP
    ready_timeout_s: float = 600.0
    version: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"group": self.group, "command": self.command, "env": dict(self.env), "ready": self.ready,
                "ready_timeout_s": self.ready_timeout_s, "version": self.version}


class ShellWord(str):
    """A rendered value that is shell text already (`"$DDOPS_SERVER_PORT"`), put into a command unquoted."""


def _parse_server(doc: YamlDoc, raw: Any) -> ServerPlan | None:
    if raw is None:
        return None
    for key, value in raw.items():
        if key not in SERVER_KEYS:
            raise _err(doc, ("server", key), f"unknown key{suggest(str(key), SERVER_KEYS)}")
        if not _is_type(value, SERVER_KEYS[key]):
            raise _err(doc, ("server", key), f"must be {type_name(SERVER_KEYS[key])}, not {describe(value)}")
    if not str(raw.get("command") or "").strip():
        raise _err(doc, ("server",), "missing `command:` (how to start the server)")
    command = raw["command"].strip()
    _check_command_shell(doc, command, ("server", "command"))
    ready = raw.get("ready", READY_TCP)
    if ready != READY_TCP and not _is_http_path(ready):
        raise _err(doc, ("server", "ready"), f"must be an HTTP path like /health (answered 2xx once the server is "
                                             f"ready) or `{READY_TCP}` (the port accepts connections)")
    version = raw.get("version")
    if version is not None and not _is_http_path(version):
        raise _err(doc, ("server", "version"), "must be an HTTP path like /version")
    deadline = raw.get("ready_timeout_minutes", 10)
    if deadline <= 0:
        raise _err(doc, ("server", "ready_timeout_minutes"), "must be a positive number of minutes")
    scope = raw.get("scope", "group")
    if scope not in SERVER_SCOPES:
        raise _err(doc, ("server", "scope"),
                   f"must be one of {', '.join(SERVER_SCOPES)}{suggest(scope, SERVER_SCOPES)}")
    return ServerPlan(command=command, ready=ready, ready_timeout_minutes=float(deadline), version=version,
                      env=_parse_env(doc, raw.get("env") or {}, ("server", "env")), scope=scope)


def _is_http_path(text: str) -> bool:
    return text.startswith("/") and not any(c.isspace() or c in "{}" for c in text)


def _check_server_port(doc: YamlDoc, keypath: tuple, server: ServerPlan | None) -> None:
    """{server_port} is the port the runner picks when it starts the server: only shell commands can see it."""
    if server is None:
        raise _err(doc, keypath, f"{{{SERVER_PORT}}} is the port of the plan's `server:`, and this plan has none")
    if "env" in keypath:
        raise _err(doc, keypath, f"{{{SERVER_PORT}}} is known only on the host, once the server starts: use it in "
                                 f"`command` or `server.command` (their environment has it as ${SERVER_PORT_ENV})")


def _with_servers(plan: BenchPlan, runs: list[RunSpec], values: list[dict[str, Any]]) -> list[RunSpec]:
    """The runs with their rendered server; with scope `group`, a run whose server renders like the previous
    run's shares its group (one server for both)."""
    if plan.server is None:
        return runs
    out: list[RunSpec] = []
    for run, vals in zip(runs, values):
        server = RunServer(group=run.index, command=render(plan.server.command, vals, shell=True),
                           env={k: render(v, vals, shell=False) for k, v in plan.server.env.items()},
                           ready=plan.server.ready, ready_timeout_s=plan.server.ready_timeout_minutes * 60,
                           version=plan.server.version)
        before = out[-1].server if out else None
        if plan.server.scope == "group" and before and (before.command, before.env) == (server.command, server.env):
            server = replace(server, group=before.group)
        out.append(replace(run, server=server))
    return out


# --- loading -----------------------------------------------------------------------------------------------------


def load_bench_plan(path: str | Path, known_patches: Iterable[str] | None = None) -> BenchPlan:
    """Load and validate a bench plan; every error is a PlaybookError starting with `file:line:`."""
    return parse_bench_plan(load_yaml_file(path, PlaybookError), known_patches)


def parse_bench_plan(doc: YamlDoc, known_patches: Iterable[str] | None = None) -> BenchPlan:
    data = doc.data
    if data is None:
        raise PlaybookError(f"{doc.path}:1: the bench plan is empty (expected a mapping with `command:`)")
    if not isinstance(data, dict):
        raise _err(doc, (), f"must be a mapping, not {describe(data)}")
    for key, value in data.items():
        if key not in TOP_KEYS:
            raise _err(doc, (key,), f"unknown key{suggest(key, TOP_KEYS)}")
        if not _is_type(value, TOP_KEYS[key]):
            raise _err(doc, (key,), f"must be {type_name(TOP_KEYS[key])}, not {describe(value)}")
    for key in REQUIRED:
        if key not in data:
            raise PlaybookError(f"{doc.path}:1: missing `{key}:`")

    name = data.get("name", Path(doc.path).stem)
    if not _NAME.match(name):
        raise _err(doc, ("name",), "use letters, digits, '.', '_' and '-' only")
    summarizer = data["summarizer"]
    if summarizer not in SUMMARIZERS:
        raise _err(doc, ("summarizer",), f"must be one of {', '.join(SUMMARIZERS)}{suggest(summarizer, SUMMARIZERS)}")
    metrics = _parse_metrics(doc, data.get("metrics"), summarizer)
    workdir = data.get("workdir", ".")
    _check_relative(doc, ("workdir",), workdir)
    results = data["results"]
    _check_relative(doc, ("results",), results)
    if "{" in results:
        raise _err(doc, ("results",), "is a glob inside the run's result dir; placeholders are not allowed here")
    gpus = data.get("gpus", 0)
    if gpus < 0:
        raise _err(doc, ("gpus",), "must be 0 (a CPU plan) or more")
    disk = data.get("min_free_disk_gb", 0)
    if disk < 0:
        raise _err(doc, ("min_free_disk_gb",), "must not be negative")
    timeout = data.get("timeout_minutes", 60)
    if timeout <= 0:
        raise _err(doc, ("timeout_minutes",), "must be a positive number of minutes")

    patches = _parse_patches(doc, data.get("requires_patches") or [], known_patches)
    plan_vars = _parse_vars(doc, data.get("vars") or {})
    matrix = _parse_matrix(doc, data.get("matrix") or {}, plan_vars)
    env = _parse_env(doc, data.get("env") or {}, ("env",))
    server = _parse_server(doc, data.get("server"))

    command = data["command"].strip()
    if not command:
        raise _err(doc, ("command",), "must not be empty")
    _check_command_shell(doc, command, ("command",))
    defined = set(plan_vars) | set(BUILTINS) | {n for _, entries in matrix for e in entries for n in e}
    templates: list[tuple[tuple[str, ...], str]] = [(("command",), command)]
    templates += [(("env", k), v) for k, v in env.items()]
    if server is not None:
        templates += [(("server", "command"), server.command)]
        templates += [(("server", "env", k), v) for k, v in server.env.items()]
    for keypath, text in templates:
        for ph in _parse_template(text, lambda msg, kp=keypath: _err(doc, kp, msg)):
            if isinstance(ph, _Var) and ph.name == SERVER_PORT:
                _check_server_port(doc, keypath, server)
            elif isinstance(ph, _Var) and ph.name not in defined:
                hint = suggest(ph.name, defined)
                raise _err(doc, keypath, f"unknown placeholder {{{ph.name}}}{hint}: define it in `vars:` or `matrix:`")

    return BenchPlan(
        name=name, command=command, results=results, summarizer=summarizer, path=doc.path,
        description=str(data.get("description", "")).strip(), workdir=workdir, env=env, matrix=matrix,
        vars=plan_vars, requires_patches=patches, gpus=gpus, min_free_disk_gb=float(disk),
        timeout_minutes=float(timeout), metrics=metrics, server=server,
        requires_packages=_parse_requirements(doc, data.get("requires_packages") or {}),
        allow_busy_gpus=bool(data.get("allow_busy_gpus", False)),
    )


def _parse_requirements(doc: YamlDoc, raw: dict) -> tuple[tuple[str, str], ...]:
    """`requires_packages: {transformers: ">=5.16,<5.25", torch: null}`: checked with the host's python first."""
    from ddops.bench.environment import requirement_error

    for name, spec in raw.items():
        error = requirement_error(name, spec)
        if error:
            raise _err(doc, ("requires_packages", name), error)
    return tuple((name, (spec or "").replace(" ", "")) for name, spec in raw.items())


def _parse_metrics(doc: YamlDoc, raw: Any, summarizer: str) -> dict[str, str]:
    if summarizer != "metrics":
        if raw is not None:
            raise _err(doc, ("metrics",), "is read only by `summarizer: metrics`")
        return {}
    if not raw:
        raise _err(doc, ("summarizer",), "`metrics` needs a `metrics:` mapping naming where tokens_per_s (or "
                                         "tpot_s) sits in the metrics file")
    out: dict[str, str] = {}
    for key, value in raw.items():
        kp = ("metrics", key)
        if key not in METRIC_KEYS:
            raise _err(doc, kp, f"unknown key{suggest(str(key), METRIC_KEYS)}")
        if not isinstance(value, str) or not value.strip() or not one_line(value):
            raise _err(doc, kp, "must be a key path (like `results.tokens_per_s`) or a CSV column name")
        out[key] = value.strip()
    if "format" in out and out["format"] not in METRIC_FORMATS:
        raise _err(doc, ("metrics", "format"), f"must be one of {', '.join(METRIC_FORMATS)}")
    if not ({"tokens_per_s", "tpot_s"} & set(out)):
        raise _err(doc, ("metrics",), "needs tokens_per_s or tpot_s: the speed the report compares")
    return out


def _parse_patches(doc: YamlDoc, patches: list, known: Iterable[str] | None) -> tuple[str, ...]:
    known_set = set(known) if known is not None else None
    for i, p in enumerate(patches):
        if not isinstance(p, str) or not _NAME.match(p):
            raise _err(doc, ("requires_patches", i), f"must be a patch id, not {describe(p)}")
        if known_set is not None and p not in known_set:
            raise _err(doc, ("requires_patches", i), f"no patch '{p}'{suggest(p, known_set)}")
    return tuple(patches)


def _parse_vars(doc: YamlDoc, raw: dict) -> dict[str, Value | None]:
    out: dict[str, Value | None] = {}
    for key, value in raw.items():
        kp = ("vars", key)
        _check_ident(doc, kp, key)
        if key in BUILTINS:
            raise _err(doc, kp, f"'{key}' is filled in by ddops; it cannot be set in a plan")
        out[key] = None if value is None else _value(doc, kp, value)
    return out


def _parse_matrix(doc: YamlDoc, raw: dict, plan_vars: dict) -> tuple[tuple[str, tuple[dict[str, Value], ...]], ...]:
    axes: list[tuple[str, tuple[dict[str, Value], ...]]] = []
    owner: dict[str, str] = {}
    for axis, values in raw.items():
        kp = ("matrix", axis)
        _check_ident(doc, kp, axis)
        if not isinstance(values, list) or not values:
            raise _err(doc, kp, f"must be a non-empty list of values, not {describe(values)}")
        entries: list[dict[str, Value]] = []
        names: set[str] | None = None
        for i, item in enumerate(values):
            ikp = kp + (i,)
            if isinstance(item, dict):
                if not item:
                    raise _err(doc, ikp, "an entry that is a mapping must set at least one placeholder")
                entry = {}
                for k, v in item.items():
                    _check_ident(doc, ikp + (k,), k)
                    if v is None:
                        raise _err(doc, ikp + (k,), "must be a value, not nothing")
                    entry[k] = _value(doc, ikp + (k,), v)
            else:
                entry = {axis: _value(doc, ikp, item)}
            if names is not None and set(entry) != names:
                raise _err(doc, ikp, f"sets {', '.join(sorted(entry))}; earlier entries set {', '.join(sorted(names))}")
            names = set(entry)
            if entry in entries:
                raise _err(doc, ikp, "duplicate entry")
            entries.append(entry)
        for n in names or ():
            if n in BUILTINS:
                raise _err(doc, kp, f"'{n}' is filled in by ddops; it cannot be a matrix value")
            if n in plan_vars:
                raise _err(doc, kp, f"'{n}' is set both here and in `vars:`; keep one")
            if n in owner:
                raise _err(doc, kp, f"'{n}' is already set by matrix axis '{owner[n]}'")
            owner[n] = axis
        axes.append((axis, tuple(entries)))
    return tuple(axes)


def _parse_env(doc: YamlDoc, raw: dict, where: tuple) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in raw.items():
        kp = where + (key,)
        _check_ident(doc, kp, key)
        if not isinstance(value, (str, int, float)) or isinstance(value, bool) or value is None:
            raise _err(doc, kp, f"must be a string or number, not {describe(value)}")
        out[key] = _text(value)
    return out


def _value(doc: YamlDoc, keypath: tuple, value: Any) -> Value:
    if isinstance(value, list):
        for i, item in enumerate(value):
            if not _is_scalar(item):
                raise _err(doc, keypath + (i,), f"list items must be strings or numbers, not {describe(item)}")
            if not one_line(item):
                raise _err(doc, keypath + (i,), ONE_LINE)
        return tuple(value)
    if not _is_scalar(value):
        raise _err(doc, keypath, f"must be a string, number, true/false or a list of those, not {describe(value)}")
    if not one_line(value):
        raise _err(doc, keypath, ONE_LINE)
    return value


# A quoted value stays one shell word, but a newline in it still ends a `# comment` around its placeholder, and
# whatever follows would run.
ONE_LINE = "must be one line: a newline (or CR, NUL) in a value would end a shell comment and run the rest"


def one_line(value: Any) -> bool:
    """No newline, carriage return or NUL in the value (or any of its items)."""
    items = value if isinstance(value, tuple) else (value,)
    return not any(isinstance(v, str) and any(c in v for c in "\n\r\0") for v in items)


def _check_relative(doc: YamlDoc, keypath: tuple, text: str) -> None:
    p = PurePosixPath(text)
    if not text or p.is_absolute() or text.startswith("~") or ".." in p.parts or any(c in text for c in "\n\0"):
        raise _err(doc, keypath, "must be a relative path inside the repo, without '..'")


def _check_ident(doc: YamlDoc, keypath: tuple, name: Any) -> None:
    if not isinstance(name, str) or not _IDENT.match(name):
        raise _err(doc, keypath, "names use letters, digits and '_' and do not start with a digit")


# Where bash evaluates a word as arithmetic, a value is an expression, and `a[$(cmd)]` in one runs cmd however it
# is quoted: (closer, name) of each context that opens with these, scanned in the command's literal text.
_ARITHMETIC_OPENERS = (("$((", "))", "`$(( ))`"), ("$[", "]", "`$[ ]`"), ("${", "}", "`${ }`"))
_ARITHMETIC_OPENERS_UNQUOTED = (("((", "))", "`(( ))`"), ("[[", "]]", "`[[ ]]`"))
# Builtins whose arguments bash evaluates as arithmetic (`let`), or may (`declare -i n=...`).
_ARITHMETIC_BUILTINS = ("let", "declare", "typeset", "local")
_COMMAND_KEYWORDS = ("if", "then", "else", "elif", "do", "while", "until", "!", "{", "time")


def _check_command_shell(doc: YamlDoc, command: str, keypath: tuple) -> None:
    """Refuse places in the command where a shell-quoted value would not stay one word, or would be evaluated."""

    def fail(msg: str) -> PlaybookError:
        return _err(doc, keypath, msg)

    if re.search(r"(?<!<)<<(?!<)", command):
        raise fail("here-documents are not supported (their bodies are expanded unquoted); put the script in the repo")
    quote: str | None = None
    escaped = False
    comment = False
    previous = "\n"
    contexts: list[tuple[str, str]] = []  # (closer, name) of the arithmetic contexts open here, innermost last
    word, at_command, builtin = "", True, None  # the simple command's words, for `let` and its kin

    def end_word() -> None:
        nonlocal word, at_command, builtin
        if at_command and word and word not in _COMMAND_KEYWORDS:
            at_command, builtin = False, word if word in _ARITHMETIC_BUILTINS else None
        word = ""

    for part in _parse_template(command, fail):
        if isinstance(part, _Var):
            where = contexts[-1][1] if contexts else f"the arguments of `{builtin}`" if builtin else None
            if where and not comment:
                raise fail(f"{{{part.name}}} is inside {where}, where bash evaluates a value as arithmetic (and "
                           "`a[$(cmd)]` in one runs cmd): compare it with [ ] (test) instead, or use it outside")
            if comment:
                raise fail(f"{{{part.name}}} is inside a shell comment; take it out of the comment (a value there "
                           "does nothing, and a newline in one would run)")
            previous = "x"
            word += "\0"
            if escaped:
                raise fail(f"{{{part.name}}} follows a backslash; remove it, ddops quotes every value itself")
            if quote is not None:
                raise fail(f"{{{part.name}}} is inside {'single' if quote == chr(39) else 'double'} quotes; "
                           "remove them, ddops quotes every value itself")
            continue
        i = 0
        while i < len(part):
            ch, width = part[i], 1
            if comment:
                comment = ch != "\n"
            elif escaped:
                escaped = False
            elif quote is None and ch == "#" and previous in " \t\n;&|()<>":
                comment = True
            elif quote == "'":
                if ch == "'":
                    quote = None
            elif opened := _arithmetic_opener(part, i, quote, previous):
                contexts.append(opened[1:])
                width = len(opened[0])
            elif contexts and part.startswith(contexts[-1][0], i):
                width = len(contexts.pop()[0])
            elif contexts and ch == "(" and contexts[-1][0] in ("))", ")"):
                contexts.append((")", contexts[-1][1]))
            elif ch == "\\":
                escaped = True
            elif quote == '"':
                if ch == '"':
                    quote = None
            elif ch in "'\"":
                quote = ch
            if quote is None and not contexts and not comment and ch in " \t\n;&|()":
                end_word()
                if ch not in " \t":
                    at_command, builtin = True, None
            elif not comment:
                word += part[i:i + width]
            previous = part[i + width - 1]
            i += width
    if quote is not None:
        raise fail(f"unbalanced {quote} quote")


def _arithmetic_opener(text: str, i: int, quote: str | None, previous: str) -> tuple[str, str, str] | None:
    """(opener, closer, name) of the arithmetic context opening at text[i], if one does."""
    for opener, closer, name in _ARITHMETIC_OPENERS + (_ARITHMETIC_OPENERS_UNQUOTED if quote is None else ()):
        if text.startswith(opener, i) and (opener != "[[" or previous in " \t\n;&|(!"):
            return opener, closer, name
    if quote is None and text[i] == "[" and (previous.isalnum() or previous == "_"):
        return "[", "]", "an array subscript"
    return None


def _err(doc: YamlDoc, keypath: tuple, message: str) -> PlaybookError:
    return PlaybookError(f"{doc.where(keypath)}: {dotted(keypath)}: {message}")


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool))


def _is_type(value: Any, expected: type | tuple[type, ...]) -> bool:
    if value is None and expected in (dict, list):
        return True
    return expected is bool if isinstance(value, bool) else isinstance(value, expected)


# --- templates ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Var:
    name: str


def _parse_template(text: str, fail) -> list[str | _Var]:
    """Split `a {x} b` into literal strings and _Var; `{{` and `}}` stand for literal braces."""
    parts: list[str | _Var] = []
    buf: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "{" and text.startswith("{{", i):
            buf.append("{")
            i += 2
        elif ch == "}" and text.startswith("}}", i):
            buf.append("}")
            i += 2
        elif ch == "{":
            end = text.find("}", i + 1)
            name = text[i + 1:end] if end != -1 else text[i + 1:]
            if end == -1 or not _IDENT.match(name):
                shown = text[i:end + 1] if end != -1 else text[i:i + 20]
                raise fail(f"bad placeholder '{shown}': write {{name}} with a plain name, or {{{{ and }}}} "
                           "for literal braces (so ${{HOME}} for ${HOME})")
            if buf:
                parts.append("".join(buf))
                buf = []
            parts.append(_Var(name))
            i = end + 1
        elif ch == "}":
            raise fail("single '}': write '}}' for a literal brace")
        else:
            buf.append(ch)
            i += 1
    if buf:
        parts.append("".join(buf))
    return parts


def _raise_value_error(msg: str) -> ValueError:
    return ValueError(msg)


def template_names(text: str) -> list[str]:
    """The placeholder names a template uses, in order (ValueError when malformed)."""
    return [p.name for p in _parse_template(text, _raise_value_error) if isinstance(p, _Var)]


def render(text: str, values: Mapping[str, Any], *, shell: bool) -> str:
    """Fill placeholders; with shell=True each value becomes shell-quoted words (a list: one word per item)."""
    out: list[str] = []
    for part in _parse_template(text, _raise_value_error):
        if not isinstance(part, _Var):
            out.append(part)
            continue
        value = values[part.name]
        if isinstance(value, ShellWord):
            out.append(value)
        elif shell:
            items = value if isinstance(value, tuple) else (value,)
            out.append(" ".join(shlex.quote(_text(v)) for v in items))
        else:
            out.append(" ".join(_text(v) for v in value) if isinstance(value, tuple) else _text(value))
    return "".join(out)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# --- expansion ---------------------------------------------------------------------------------------------------


def expand_runs(plan: BenchPlan, host_vars: Mapping[str, Any], result_dir: str = "results") -> list[RunSpec]:
    """One RunSpec per point of the matrix (cartesian product, YAML order); values: matrix > host > plan vars."""
    base: dict[str, Any] = {k: v for k, v in plan.vars.items() if v is not None}
    base.update((k, tuple(v) if isinstance(v, list) else v) for k, v in host_vars.items()
                if k not in RUN_BUILTINS and v is not None)
    base.update(plan.overrides)
    base["result_dir"] = result_dir
    base[SERVER_PORT] = ShellWord(f'"${SERVER_PORT_ENV}"')
    needed = plan.placeholders
    runs: list[RunSpec] = []
    rendered: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    axes = [entries for _, entries in plan.matrix]
    for index, combo in enumerate(itertools.product(*axes)):
        params: dict[str, Value] = {k: v for entry in combo for k, v in entry.items()}
        values = {**base, **params, "run_index": index}
        for name in needed:
            if name not in values:
                what = "a required plan var" if name in plan.vars else "a host value"
                host = host_vars.get("host", "the host")
                raise PlaybookError(f"{plan.path}: {plan.name}: {{{name}}} is {what}, and {host} does not set it "
                                    f"(add it to the host's `vars:` in the inventory)")
            if not _is_scalar(values[name]) and not (isinstance(values[name], tuple)
                                                     and all(_is_scalar(v) for v in values[name])):
                raise PlaybookError(f"{plan.path}: {plan.name}: {{{name}}}: host value must be a string, number "
                                    f"or list of those, not {describe(values[name])}")
            if not one_line(values[name]):
                raise PlaybookError(f"{plan.path}: {plan.name}: {{{name}}}: the value for "
                                    f"{host_vars.get('host', 'the host')} {ONE_LINE}")
        command = render(plan.command, values, shell=True)
        if command in seen:
            raise PlaybookError(f"{plan.path}: {plan.name}: runs {seen[command]} and {index} expand to the same "
                                "command; use every matrix value in `command` (e.g. in the save path)")
        seen[command] = index
        env = {k: render(v, values, shell=False) for k, v in plan.env.items()}
        runs.append(RunSpec(index=index, params=params, command=command, env=env))
        rendered.append(values)
    return _with_servers(plan, runs, rendered)


def parse_assignments(items: Iterable[str], option: str) -> dict[str, tuple[str, ...]]:
    """`["dataset=gsm8k,math500", "x=1"]` -> {dataset: (gsm8k, math500), x: (1,)}; UsageError when malformed."""
    out: dict[str, tuple[str, ...]] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not _IDENT.match(name.strip()):
            raise UsageError(f"{option} {item!r}: write NAME=VALUE")
        if not one_line(value):
            raise UsageError(f"{option} {name}: the value {ONE_LINE}")
        name = name.strip()
        # --only takes several values (`dataset=gsm8k,math500`); a --var value is one string, commas and all.
        values = tuple(value.split(",")) if option == "--only" else (value,)
        out[name] = out.get(name, ()) + values if option == "--only" else values
    return out


def narrow_plan(plan: BenchPlan, variables: Mapping[str, str] | None = None,
                only: Mapping[str, Iterable[str]] | None = None) -> BenchPlan:
    """The plan with --var values set for every run and its matrix cut to the --only values (a smoke run).

    --var NAME=VALUE sets a placeholder the plan uses (beating the plan's and the host's vars); a matrix axis is
    chosen with --only instead. --only NAME=V1,V2 keeps the matrix entries whose NAME is one of the values."""
    variables, only = dict(variables or {}), {k: tuple(v) for k, v in (only or {}).items()}
    matrix_names = {n for _, entries in plan.matrix for e in entries for n in e}
    usable = set(plan.placeholders) | set(plan.vars)
    for name in variables:
        if name in matrix_names:
            raise UsageError(f"--var {name}: {name} is a matrix value of {plan.name}; pick values with "
                             f"--only {name}=...")
        if name in BUILTINS:
            raise UsageError(f"--var {name}: '{name}' is filled in by ddops")
        if name not in usable:
            raise UsageError(f"--var {name}: {plan.name} has no placeholder {{{name}}}{suggest(name, usable)}")
    matrix = []
    for axis, entries in plan.matrix:
        kept = entries
        for name, values in only.items():
            if any(name in e for e in entries):
                kept = tuple(e for e in kept if _text(e[name]) in values)
                if not kept:
                    have = ", ".join(dict.fromkeys(_text(e[name]) for e in entries))
                    raise UsageError(f"--only {name}={','.join(values)}: no such value in {plan.name} "
                                     f"(it has {have})")
        matrix.append((axis, kept))
    unknown = [n for n in only if n not in matrix_names]
    if unknown:
        raise UsageError(f"--only {unknown[0]}: {plan.name}'s matrix has no {unknown[0]}"
                         f"{suggest(unknown[0], matrix_names)}")
    return replace(plan, matrix=tuple(matrix), overrides={**plan.overrides, **variables})


def check_host(plan: BenchPlan, *, gpus: int | None, free_disk_gb: float | None,
               applied_patches: Iterable[str] | None) -> list[str]:
    """Why a host cannot run this plan (empty when it can); None means the fact is unknown and not checked."""
    problems: list[str] = []
    if gpus is not None and gpus < plan.gpus:
        problems.append(f"needs {plan.gpus} GPU(s), host has {gpus}")
    if free_disk_gb is not None and free_disk_gb < plan.min_free_disk_gb:
        problems.append(f"needs {plan.min_free_disk_gb:g} GB free disk, host has {free_disk_gb:.1f} GB")
    if applied_patches is not None:
        missing = [p for p in plan.requires_patches if p not in set(applied_patches)]
        if missing:
            problems.append(f"patches not applied: {', '.join(missing)} (run `ddops patch {' '.join(missing)}`)")
    return problems
