"""aiayn.pipeline."""
