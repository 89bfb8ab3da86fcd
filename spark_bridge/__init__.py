"""The bridge between raybroker and Spark through RayDP (to come)."""
