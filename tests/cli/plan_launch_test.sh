#!/usr/bin/env bash
# `ds41rt plan` and `ds41rt launch --dry-run` as a user runs them: exit codes, the refusal with
# its shortfall, plan.json written by --out, the launch commands. Run by ctest from the source
# directory with the binary as $1.
set -u
BIN=$1
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
check() {  # name, expected exit, actual exit, file, regex
    if [ "$2" != "$3" ]; then echo "FAIL $1: exit $3, expected $2"; cat "$4"; fails=$((fails + 1)); return; fi
    if ! grep -Eq "$5" "$4"; then echo "FAIL $1: output does not match /$5/"; cat "$4"; fails=$((fails + 1)); return; fi
    echo "ok   $1"
}

# Official V4.1 experts (288.8 GB) on two H200s and no workers: refused, naming the layers and the shortfall.
"$BIN" plan --model-type deepseek_v41 --format official --gpus 2 >"$TMP/out" 2>&1; rc=$?
check refusal 1 $rc "$TMP/out" '^ds41rt plan: infeasible: the routed experts of layers [0-9]+-39 .*there are no workers; short by [0-9]+\.[0-9]{2} GiB$'

# EXL3 K2 fits the same pair, each layer on the GPU of its attention; --out writes a plan that names its format and version.
"$BIN" plan --model-type deepseek_v41 --format exl3 --gpus 2 --out "$TMP/plan.json" >"$TMP/out" 2>&1; rc=$?
check exl3_two_gpus 0 $rc "$TMP/out" '^  20-39 +gpu1 '
check plan_json 0 0 "$TMP/plan.json" '"format": "exl3"'

# Bad arguments are not refusals.
"$BIN" plan --format fp3 >"$TMP/out" 2>&1; rc=$?
check bad_format 2 $rc "$TMP/out" "format: 'fp3' is not official, nvfp4 or exl3"

# The loopback deployment: every layer remote on two CPU workers; a dry run writes nothing.
"$BIN" launch --config docs/deploy/loopback-cpu.json --dry-run >"$TMP/out" 2>&1; rc=$?
check dry_run 0 $rc "$TMP/out" '^  \[worker 1 +local\] ds41rt worker --plan build/loopback-plan.json --rank 1 --listen 127.0.0.1:19442'
check dry_run_serve 0 $rc "$TMP/out" '^  \[coordinator local\] ds41rt serve --model tests/fixtures/deepseek-v4-flash-quant --plan build/loopback-plan.json'
check dry_run_nothing 0 $rc "$TMP/out" '^dry run: nothing started$'
[ -e build/loopback-plan.json ] && { echo "FAIL dry run wrote build/loopback-plan.json"; fails=$((fails + 1)); }

# A real launch whose worker 1 is on another host (127.0.0.2 is not this machine's loopback name)
# and not running: refused before anything starts, naming it and the command to run there. (The
# launch that starts processes is tests/e2e/test_launch.py.)
printf '{"model": {"type": "deepseek_v41"}, "coordinator": {"cpu": true, "listen": "127.0.0.1:1"},
  "workers": [{"endpoint": "127.0.0.1:2", "device": "cpu"}, {"endpoint": "127.0.0.2:3", "device": "cpu"}],
  "local_layers": 38, "plan": "%s/remote-plan.json"}' "$TMP" >"$TMP/remote.json"
"$BIN" launch --config "$TMP/remote.json" >"$TMP/out" 2>&1; rc=$?
check remote_worker_down 1 $rc "$TMP/out" 'worker 1 at 127.0.0.2:3 is on another host .*the launcher cannot start it'
check remote_worker_command 1 $rc "$TMP/out" '^    ds41rt worker --plan .*/remote-plan.json --rank 1 --listen 127.0.0.2:3'
check remote_nothing_started 1 $rc "$TMP/out" 'probing it failed'
grep -q "started worker" "$TMP/out" && { echo "FAIL remote: a process was started"; fails=$((fails + 1)); }
[ -e "$TMP/remote-plan.json" ] || { echo "FAIL remote: the plan was not written"; fails=$((fails + 1)); }

printf '{"model": {"type": "deepseek_v41"}, "coordinator": {"gpus": [{"device": 0}]}, "worker": []}' >"$TMP/bad.json"
"$BIN" launch --config "$TMP/bad.json" --dry-run >"$TMP/out" 2>&1; rc=$?
check bad_config 2 $rc "$TMP/out" 'deployment: worker: unknown field'

exit $((fails > 0))
