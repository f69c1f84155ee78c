"""The pure patch core: playbooks, transforms (libcst), planning with a content-hash cache, checks, the journal and
rollback plans, and what a host's snapshot means per patch. No session, no fleet: ddops/tasks/patch.py acts on it.

Importing this package stays cheap: libcst is loaded only with `ddops.patching.transforms`, which plan.py imports
only when the prefilter (prefilter.py) cannot settle a transform without it."""
