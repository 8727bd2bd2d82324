# dedup: the two commands of the README, and the benchmark. Each sets up what it needs.
.PHONY: demo demo-sessions test bench setup

demo:  ## build and install the extension, run the guide's experiment and print its table (ARGS="--runs 1")
	bash scripts/demo.sh $(ARGS)

demo-sessions:  ## build and install the extension, show two sessions racing for one job
	bash scripts/demo.sh sessions

test:  ## set up everything and pass every test
	bash scripts/test.sh

bench:  ## the pgbench comparison of the README (release build, several minutes)
	bash scripts/bench.sh

setup:  ## only the setup: Debian packages, cargo-pgrx 0.18.1, cargo pgrx init
	bash scripts/setup.sh
