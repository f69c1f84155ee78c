"""docs/json.md's key tables are the report types' keys: each table lists exactly the keys its reports' to_json() can
write (a report's fields, and the keys its own to_json spells), so the documented contract and the code cannot
drift apart; the values a table only mentions in passing have each of their keys named there too."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap

import pytest

from ddops import errors, pins
from ddops.bench import runs
from ddops.fleet import HostResult
from ddops.jsonvalue import JsonValue
from ddops.patching import backups, checks, kinds, lint, reports
from ddops.tasks import adhoc, journal_status, patch, ping, sync
from tests.conftest import REPO_ROOT

DOC = REPO_ROOT / "docs" / "json.md"

# A section's heading -> the types whose JSON its table lists (a command's task returns one of them).
TABLES = {
    "Each entry of `hosts`": [HostResult],
    "`patch`": [reports.PatchReport],
    "`verify`": [reports.VerifyReport],
    "`status`": [reports.StatusReport, journal_status.JournalReport, patch.PinnedStatus],
    "`rollback`": [reports.RollbackReport],
    "`sync`": [sync.SyncReport],
    "`deploy`": [sync.DeployReport],
    "`bench run`": [runs.LaunchReport, runs.PreflightReport],
    "`bench status`": [runs.RunReport],
    "`bench logs`": [runs.LogReport],
    "`bench stop`": [runs.StopReport],
    "`bench list`": [runs.RunList],
    "`bench collect`": [runs.CollectReport],
    "`exec`": [adhoc.ExecOutput],
    "`ping`": [ping.PingReport],
    "`backups list`": [reports.SavedEdits],
    "`backups show`": [reports.ShownEdit],
    "`backups restore`": [reports.RestoreReport],
    "`playbook lint`": [lint.LintReport],
    "`files` entries (patch, status)": [reports.FileReport],
    "`checks` entries (patch, verify)": [checks.CheckResult, reports.VerifyCheck],
}
# Values inside those, whose keys the section names in its prose.
MENTIONED = {
    "`status`": [journal_status.AppliedPatch, pins.PinSummary],
    "`rollback`": [reports.Refusal, reports.SavedCopy],
    "`sync`": [sync.Step],
    "`deploy`": [sync.Step],
    "`bench status`": [runs.HostRun, runs.RunRecord],
    "`bench list`": [runs.RunEntry],
    "`backups list`": [backups.SavedEdit],
    "`playbook lint`": [lint.SampleReport, lint.PatchFinding],
    "`files` entries (patch, status)": [reports.PatchInFile],
}


def json_keys(cls: type) -> tuple[list[str], bool]:
    """(the keys cls's to_json() can write, whether it also spreads a mapping of the host's, such as ping's facts):
    a JsonValue's fields when it has no to_json of its own or spreads JsonValue.to_json(self) in it, and every key
    its own to_json spells."""
    own = cls.__dict__.get("to_json")
    keys, with_fields, spreads_host_keys = [], own is None, False
    if own is not None:
        for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(own)))):
            if isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values):
                    if isinstance(key, ast.Constant):
                        keys.append(key.value)
                    elif key is None and ast.unparse(value) == "JsonValue.to_json(self)":
                        with_fields = True
                    elif key is None and ast.unparse(value).startswith("self."):
                        spreads_host_keys = True
    if with_fields:
        keys = [f.name for f in dataclasses.fields(cls)] + keys
    return keys, spreads_host_keys


def sections() -> dict[str, str]:
    """`### heading` -> the text under it."""
    text = DOC.read_text()
    found = {}
    for match in re.finditer(r"^### ([^\n]+)\n(.*?)(?=^#)", text, re.S | re.M):
        found[match.group(1).strip()] = match.group(2)
    return found


def table_keys(section: str) -> tuple[set[str], bool]:
    """(every backticked key in the first column of the section's table, whether a `...` row is there)."""
    keys, more = set(), False
    for line in section.splitlines():
        if line.startswith("| ") and not line.startswith(("| key", "|---")):
            first = line.split("|")[1].strip()
            more = more or first == "..."
            keys |= set(re.findall(r"`([^`]+)`", first))
    return keys, more


@pytest.mark.parametrize("heading", list(TABLES))
def test_each_table_lists_exactly_the_keys_its_reports_write(heading):
    section = sections().get(heading)
    assert section is not None, f"docs/json.md has no section ### {heading}"
    documented, more = table_keys(section)
    written = {key for cls in TABLES[heading] for key in json_keys(cls)[0]}
    assert (sorted(documented - written), sorted(written - documented)) == ([], []), \
        f"### {heading}: (documented, never written; written, not documented)"
    assert more == any(json_keys(cls)[1] for cls in TABLES[heading]), f"### {heading}: `...` row"


@pytest.mark.parametrize("heading", list(MENTIONED))
def test_the_values_a_section_mentions_have_every_key_named_there(heading):
    section = sections()[heading]
    named = set(re.findall(r"`([^`]+)`", section))
    missing = {cls.__name__: [k for k in json_keys(cls)[0] if k not in named] for cls in MENTIONED[heading]}
    assert {name: keys for name, keys in missing.items() if keys} == {}


def test_every_report_value_is_documented():
    documented = {cls.__qualname__ for types in (*TABLES.values(), *MENTIONED.values()) for cls in types}

    def subclasses(cls: type) -> set[str]:  # by name: slots=True leaves the class it replaced among them
        return {name for sub in cls.__subclasses__() for name in {sub.__qualname__, *subclasses(sub)}
                if sub.__module__.startswith("ddops.")}

    assert sorted(subclasses(JsonValue) - documented) == []


def test_the_states_and_error_kinds_a_consumer_meets_are_all_named():
    text = DOC.read_text()
    states = [*kinds.PatchState, *pins.PinState]
    controller_kinds = {cls.kind for cls in vars(errors).values()
                        if isinstance(cls, type) and issubclass(cls, errors.DdopsError)} | {pins.SyncError.kind}
    assert [s for s in states if f"`{s}`" not in text] == []
    assert sorted(k for k in controller_kinds | {"internal"} if f"`{k}`" not in text) == []
