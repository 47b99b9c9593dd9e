"""Capacity planning on top of replays and sweeps: the highest load a
deployment sustains under its service-level objectives (`capacity`; the
objectives themselves are config, `servesim.config.slo`), and the cheapest
deployment of a grid that meets them (`search`)."""
