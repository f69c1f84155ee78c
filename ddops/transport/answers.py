"""What an agent answer must hold before the tasks read it: a malformed answer (a broken or hostile host) is one
error naming the verb and the field, never a TypeError deep in a task.

Each verb's fields the controller reads, as (path, allowed types, required): a path's parts are keys, `*` is every
item of a list or value of an object; a field that is absent is checked only when required."""

from __future__ import annotations

from typing import Any

from ddops.errors import AgentError

BAD_ANSWER = "bad_answer"  # AgentError kind

STR, INT, BOOL, OBJ, LIST, NULL = (str,), (int,), (bool,), (dict,), (list,), (type(None),)
NUMBER = (int, float)

_RUN_STATE = (("runs", LIST + NULL, False), ("runs.*", OBJ, False), ("total", INT + NULL, False),
              ("done", INT + NULL, False), ("current", INT + NULL, False),
              *((key, STR + NULL, False) for key in ("run_id", "status", "plan", "created", "started", "ended",
                                                     "message")))

SHAPES: dict[str, tuple[tuple[str, tuple[type, ...], bool], ...]] = {
    "snapshot": (("files", OBJ, True), ("files.*", OBJ, False), ("files.*.exists", BOOL, False),
                 ("files.*.sha256", STR + NULL, False), ("files.*.content_b64", STR + NULL, False),
                 ("files.*.error", OBJ + NULL, False), ("files.*.error.message", STR + NULL, False),
                 ("files.*.error.kind", STR + NULL, False), ("journal", LIST + NULL, False),
                 ("journal.*", OBJ, False), ("journal_corrupt", LIST + NULL, False), ("journal_corrupt.*", OBJ, False),
                 ("lock", OBJ + NULL, False), ("facts", OBJ + NULL, False)),
    "commit": (("written", LIST, False), ("written.*", STR, False), ("reverted", BOOL, False),
               ("checks", LIST, False), ("checks.*", OBJ, False), ("checks.*.name", STR, True),
               ("checks.*.ok", BOOL, True), ("checks.*.output", STR + NULL, False),
               ("checks.*.exit_code", INT + NULL, False)),
    "rollback": (*((f"{key}.*", STR, False) for key in ("restored", "unchanged")),
                 *((key, LIST, False) for key in ("restored", "unchanged", "refused", "saved", "failed")),
                 *((f"{key}.*", OBJ, False) for key in ("refused", "saved", "failed")),
                 *((f"{key}.*.path", STR, True) for key in ("refused", "saved", "failed")),
                 ("refused.*.reason", STR + NULL, False), ("saved.*.sha256", STR, True),
                 ("failed.*.message", STR + NULL, False)),
    "journal": (("entries", LIST, True), ("entries.*", OBJ, False), ("corrupt", LIST + NULL, False),
                ("corrupt.*", OBJ, False), ("corrupt.*.line", INT, False)),
    "bench_list": (("runs", LIST + NULL, False), ("runs.*", OBJ, False), ("runs.*.done", INT + NULL, False),
                   ("runs.*.total", INT + NULL, False),
                   *((f"runs.*.{key}", STR + NULL, False) for key in ("run_id", "plan", "status", "created",
                                                                        "started", "ended"))),
    "bench_poll": (("state", OBJ + NULL, False), *((f"state.{p}", t, r) for p, t, r in _RUN_STATE),
                   ("log_b64", STR + NULL, False), ("offset", INT, False), ("log_size", INT, False),
                   ("failures", OBJ + NULL, False), ("failures.*", STR, False)),
    "bench_status": (("state", OBJ, True), *((f"state.{p}", t, r) for p, t, r in _RUN_STATE),
                     ("failures", OBJ + NULL, False), ("failures.*", STR, False)),
}


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false", type(None): "null"}.get(
        type(value), "a number" if isinstance(value, NUMBER) else type(value).__name__)


def _allowed(value: Any, types: tuple[type, ...]) -> bool:
    return bool in types if isinstance(value, bool) else isinstance(value, types)


def _names(types: tuple[type, ...]) -> str:
    return " or ".join(dict.fromkeys(_kind(t() if t is not type(None) else None) for t in types))


def _check(value: Any, parts: list[str], where: str, types: tuple[type, ...], required: bool, fail: Any) -> None:
    if not parts:
        if not _allowed(value, types):
            fail(f"`{where}` must be {_names(types)}, not {_kind(value)}")
        return
    head, rest = parts[0], parts[1:]
    if head == "*":
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, item in items:
            _check(item, rest, f"{where}[{key}]", types, required, fail)
    elif isinstance(value, dict):
        if head in value:
            _check(value[head], rest, f"{where}.{head}" if where else head, types, required, fail)
        elif required:
            fail(f"`{where}.{head}` is missing" if where else f"`{head}` is missing")


def check_answer(host: str, verb: str, result: Any) -> dict[str, Any]:
    """`result` itself once it holds what the controller reads of `verb`; AgentError (kind bad_answer) naming the
    first field that does not."""
    def fail(problem: str) -> None:
        raise AgentError(f"the agent's {verb} answer is malformed: {problem}", kind=BAD_ANSWER, host=host)

    if not isinstance(result, dict):
        fail(f"`result` must be an object, not {_kind(result)}")
    for path, types, required in SHAPES.get(verb, ()):
        _check(result, path.split("."), "", types, required, fail)
    return result
