"""aiayn.export."""
