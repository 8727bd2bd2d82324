# dedup: the two commands of the README, and the benchmark. Each sets up what it needs.
.PHONY: demo test bench setup

demo:  ## build and install the extension, run the demonstration in a throwaway server
	bash scripts/demo.sh

test:  ## set up everything and pass every test
	bash scripts/test.sh

bench:  ## the pgbench comparison of the README (release build, several minutes)
	bash scripts/bench.sh

setup:  ## only the setup: Debian packages, cargo-pgrx 0.18.1, cargo pgrx init
	bash scripts/setup.sh
