# dedup: the two commands of the README, and the benchmark. Each sets up what it needs.
.PHONY: demo demo-sessions test soak bench bench-citus setup package install portable clients

demo:  ## build and install the extension, run the guide's experiment and print its table (ARGS="--runs 1")
	bash scripts/demo.sh $(ARGS)

demo-sessions:  ## build and install the extension, show two sessions racing for one job
	bash scripts/demo.sh sessions

test:  ## set up everything and pass the tests on every major (PG=17: every test on one)
	PG="$(PG)" bash scripts/test.sh

soak:  ## the long soak of docs/operations.md: claims, batches, leases and offsets under disruptions for HOURS (default 6) on PG (default 17)
	bash scripts/soak.sh $(or $(HOURS),6) $(or $(PG),17)

bench:  ## the pgbench comparison of docs/performance.md (release build, several minutes)
	PG="$(PG)" bash scripts/bench.sh

bench-citus:  ## the Citus comparison of docs/citus.md: a coordinator and two workers (release build, about 5 minutes)
	bash scripts/bench-citus.sh

setup:  ## only the setup: Debian packages, the PostgreSQL trees, cargo-pgrx 0.18.1, cargo pgrx init
	bash scripts/setup.sh

package:  ## a Debian package and a tarball per major in target/packages (PG=17 for one)
	PG="$(PG)" bash scripts/package.sh

portable:  ## the portable edition (SQL and PL/pgSQL, no dedup.so) in target/portable: a pg_tle registration script, a plain script and the switch to the native extension (docs/portable.md)
	bash scripts/portable.sh

clients:  ## the client packages (clients/: Python wheel and sdist, npm tarball, Rust crate) in target/clients
	bash scripts/clients.sh

install:  ## a release build installed into the server of PG_CONFIG (the only target that touches a server of yours)
	bash scripts/install.sh $(PG_CONFIG)
