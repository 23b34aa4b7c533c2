"""`tracebench sweep`: rate and concurrency sweeps and the capacity search, above replay/ and report/.

Each point is an ordinary replay (a run folder) on servers launched once for the whole sweep; each point's figures
come from the report's own code. Imported by nothing but the CLI."""
