#!/usr/bin/env bash
# Reproduces every figure in docs/BENCHMARKS.md (about 40 minutes on 2 cores).
# Run from the repository root in the project's venv; nothing else should be running.
set -euo pipefail
out=docs/results
mkdir -p "$out"
run() { echo "+ $*" | tee -a "$out/commands.log"; "$@"; }

# Faults, compass and celery-default side by side, 400 jobs of edge-vision at 6 jobs/s;
# times are real seconds into each policy's run. `docs/run_benchmarks.sh faults` runs only these.
faults() {
  local base=(compass-celery bench --workload dags/edge-vision.json --jobs 400
              --policies celery-default,compass --quiet)
  local -A cases=(
    [rolling-restart]="--rolling-restart-after 5"
    [kill-worker]="--kill-worker-after 10"
    [restart-redis-aof]="--restart-redis-after 10 --redis-aof"
    [restart-redis-no-aof]="--restart-redis-after 10 --no-redis-aof"
    [pause-redis]="--pause-redis-after 10"
    [clock-skew]="--skew-clock-s 30"
    [long-task]="--long-task-s 20"
  )
  local name
  for name in rolling-restart kill-worker restart-redis-aof restart-redis-no-aof pause-redis \
              clock-skew long-task; do
    # shellcheck disable=SC2086  # the flags split on purpose
    run "${base[@]}" ${cases[$name]} --json "$out/fault-$name.json" \
        | tee "$out/fault-$name.txt"
    mkdir -p "bench-out/fault-logs/$name" && cp bench-out/logs/*.log "bench-out/fault-logs/$name/"
    rm -f bench-out/logs/*.log
  done
  python -m compass_celery.bench.suite "$out" | tee "$out/faults.md"
}
if [[ ${1:-} == faults ]]; then faults; exit 0; fi

# 1. edge-vision at its default rate (6 jobs/s, 400 jobs), every policy
run compass-celery bench --workload dags/edge-vision.json --quiet \
    --json "$out/edge-vision.json" --plot "$out/edge-vision.png" | tee "$out/edge-vision.txt"
# 2. light load (rate/4) for the lower-bound target
run compass-celery bench --workload dags/edge-vision.json --rate 1.5 --jobs 150 \
    --policies compass,celery-default --quiet --json "$out/edge-vision-light.json" \
    | tee "$out/edge-vision-light.txt"
# 3. half the servers: compass on 2 and 1 workers, celery-default on 3, same arrivals
run compass-celery bench --workload dags/edge-vision.json --workers 2 --policies compass,hash \
    --quiet --json "$out/edge-vision-2w.json" | tee "$out/edge-vision-2w.txt"
run compass-celery bench --workload dags/edge-vision.json --workers 3 --policies celery-default \
    --quiet --json "$out/edge-vision-3w.json" | tee "$out/edge-vision-3w.txt"
# 4. the two workloads in dags/
run compass-celery bench --workload dags/caption-translate.json --jobs 200 --quiet \
    --json "$out/caption-translate.json" --plot "$out/caption-translate.png" \
    | tee "$out/caption-translate.txt"
run compass-celery bench --workload dags/vision-fanout.json --jobs 200 --quiet \
    --json "$out/vision-fanout.json" --plot "$out/vision-fanout.png" | tee "$out/vision-fanout.txt"
# 5. faults, compass and plain Celery side by side: see faults() above
faults
# 6. simulator: the same planner on 1,000 workers; count_pending on and off
run compass-celery simulate --workload dags/edge-vision.json --workers 1000 --rate 1500 \
    --policies celery-default,jsq,hash,heft,compass \
    --jobs 10000 --json "$out/sim-1000.json" | tee "$out/sim-1000.txt"
run python -m compass_celery.sim --workload dags/edge-vision.json --compare-pending \
    | tee "$out/sim-pending.txt"
# 7. hot-path costs
run python -m compass_celery.bench.plan_timing | tee "$out/plan-timing.txt"
run python -m compass_celery.bench.overhead | tee "$out/overhead.txt"
# 8. the model cache's eviction policy alone: same placement (jsq, compass), LRU vs look-ahead
for cp in lru lookahead; do
  run compass-celery bench --workload dags/edge-vision.json --jobs 200 --policies jsq,compass \
      --cache-policy "$cp" --quiet --json "$out/cache-$cp.json" | tee "$out/cache-$cp.txt"
done
# 9. latency against load
run compass-celery bench --workload dags/edge-vision.json --policies celery-default,hash,compass \
    --jobs 150 --sweep-rate 3,6,9,12 --quiet --json "$out/sweep.json" --plot "$out/sweep.png" \
    | tee "$out/sweep.txt"
