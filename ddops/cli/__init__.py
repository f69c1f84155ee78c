"""The typer CLI: the only place that imports typer and rich."""
