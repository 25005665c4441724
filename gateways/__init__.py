"""valetkey data plane: one gateway per upstream injects the real secret."""
