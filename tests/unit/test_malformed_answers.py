"""A broken or hostile host's agent answers that are not what the protocol says (a list for an object, a number for
a string, an error that is not an object) fail that host with one line naming the verb and the field, through the
real CLI; never "internal error: AttributeError" (a `connection: local` host whose python is a hostile agent)."""

from __future__ import annotations

import json

import pytest

from ddops.errors import AgentError
from ddops.transport.answers import check_answer
from tests.conftest import run_ddops
from tests.unit.test_hostile_text import ENV, hostile_agent, local_inventory

SNAPSHOT = {"repo": "/r", "files": {}, "journal": [], "journal_corrupt": [], "lock": None, "facts": None}


@pytest.mark.parametrize("args, answers, says", [
    (("status", "--all"), {"*": {"ok": True, "result": "x"}},
     "the agent's snapshot answer is malformed: `result` must be an object, not a string"),
    (("patch", "--all", "cpu-timing"), {"*": {"ok": True, "result": []}},
     "the agent's snapshot answer is malformed: `result` must be an object, not a list"),
    (("patch", "--all", "cpu-timing"), {"snapshot": {"ok": True, "result": {**SNAPSHOT, "files": []}}},
     "the agent's snapshot answer is malformed: `files` must be an object, not a list"),
    (("verify", "--all", "cpu-timing"), {"snapshot": {"ok": True, "result": {**SNAPSHOT, "files": {"dflash.py": 1}}}},
     "the agent's snapshot answer is malformed: `files[dflash.py]` must be an object, not a number"),
    (("patch", "--all", "cpu-timing"),
     {"snapshot": {"ok": True, "result": {**SNAPSHOT, "files": {"dflash.py": {"exists": True, "sha256": 7}}}}},
     "the agent's snapshot answer is malformed: `files[dflash.py].sha256` must be a string or null, not a number"),
    (("rollback", "--all"), {"journal": {"ok": True, "result": {"entries": "x"}}},
     "the agent's journal answer is malformed: `entries` must be a list, not a string"),
    (("bench", "list", "--all"), {"bench_list": {"ok": True, "result": {"runs": [1]}}},
     "the agent's bench_list answer is malformed: `runs[0]` must be an object, not a number"),
    (("bench", "status", "--all", "r1"), {"*": {"ok": True, "result": {"state": "x"}}},
     "the agent's bench_status answer is malformed: `state` must be an object, not a string"),
    (("ping", "--all"), {"*": {"ok": False, "error": ["x"]}}, "agent facts failed: ['x']"),
    (("status", "--all"), {"*": {"ok": False, "error": {"kind": 5, "message": ["x"]}}},
     "agent snapshot failed: {'kind': 5, 'message': ['x']}"),
])
def test_a_malformed_answer_fails_its_host_with_one_line_naming_the_verb_and_field(tmp_path, args, answers, says):
    agent = hostile_agent(tmp_path, answers)
    proc = run_ddops("--json", *args, inventory=local_inventory(tmp_path, agent), env=ENV)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1, doc
    [host] = doc["hosts"]
    assert (host["status"], host["message"]) == ("failed", says), host
    shown = run_ddops(*args, inventory=local_inventory(tmp_path / "again", agent), env=ENV)
    assert "Traceback" not in shown.stderr and "internal error" not in shown.stdout + shown.stderr, shown.stderr


def test_a_well_formed_answer_passes_and_the_first_bad_field_is_named():
    assert check_answer("h", "commit", {"written": ["a.py"], "checks": [{"name": "c", "ok": True}]})["written"]
    with pytest.raises(AgentError) as caught:
        check_answer("h", "commit", {"written": ["a.py"], "checks": [{"name": "c"}]})
    assert (caught.value.host, caught.value.kind, caught.value.message) == (
        "h", "bad_answer", "the agent's commit answer is malformed: `checks[0].ok` is missing")
    assert check_answer("h", "a_verb_of_a_newer_ddops", {"anything": [1]}) == {"anything": [1]}
