"""Command-line interface: ``torchinferno`` / ``python -m torchinferno.cli``."""
