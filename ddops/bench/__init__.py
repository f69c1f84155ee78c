"""`ddops bench`: plans (plan.py), safe result reading (results.py), summarizers, the report and its plot.

Only results.py imports torch, lazily, inside the function that reads `.pt` files; plot.py imports matplotlib
the same way. Everything else here is pure and cheap to import."""
