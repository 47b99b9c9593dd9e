"""The `servesim` command line: the group and the replay commands (`main`),
and the `fit`/`evaluate` (`fitting`), `models`/`gpus`/`calibrate`
(`deployment`) and `capacity`/`search` (`capacity`) commands. Everything
heavy is imported inside the commands, so `servesim --help` stays light."""
