"""`bpdbench sweep GRID`: a grid of run / replay / oracle / analyze / tune / speed cells executed as Ray tasks.

grid.py reads and validates the TOML file and expands it into cells (each one command's RunConfig, the same the CLI
would build) and the artefacts they need; cells.py is what a Ray worker runs (the commands' own functions, with
`resume`); driver.py connects to Ray, submits artefacts before the cells that need them, retries, reports. Nothing
else imports this package, and Ray is imported only when a sweep actually runs.
"""
