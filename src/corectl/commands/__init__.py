"""The operations behind each CLI command (the typer layer in cli.py stays thin)."""
