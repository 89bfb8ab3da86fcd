"""`raybroker bench` scenarios (local, activation, remote) and their report format."""
