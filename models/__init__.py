"""aiayn.models."""
