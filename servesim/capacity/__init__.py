"""Capacity planning on top of replays and sweeps: service-level objectives
(`slo`), the highest load a deployment sustains under them (`capacity`), and
the cheapest deployment of a grid that meets them (`search`)."""
