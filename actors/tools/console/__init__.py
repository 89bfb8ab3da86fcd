"""`raybroker console`: a web page for operators (actors.tools.console.command)."""
