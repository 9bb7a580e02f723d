"""Building blocks shared by every family: attention metadata/backends, rope, norms."""
