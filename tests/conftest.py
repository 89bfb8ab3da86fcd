"""Settings for the whole suite."""

from hypothesis import HealthCheck, settings

# Shared 2-core machines: a slow moment must not fail a property test on time alone.
settings.register_profile("raybroker", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("raybroker")
