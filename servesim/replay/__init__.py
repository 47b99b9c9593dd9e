"""One replay of a workload on a config: the run API (`api`), the driver and
its event loop over engine cores (`driver`), the routers that pick a rank
(`router`), disaggregated prefill and decode pools (`disaggregated`),
telemetry samples (`telemetry`) and why requests did not finish
(`diagnosis`)."""
