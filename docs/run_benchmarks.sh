#!/usr/bin/env bash
# Reproduces every figure in docs/BENCHMARKS.md (about an hour on 2 cores).
# Run from the repository root in the project's venv; nothing else should be running.
set -euo pipefail
out=docs/results
mkdir -p "$out"
run() { echo "+ $*" | tee -a "$out/commands.log"; "$@"; }

# Faults, compass and celery-default side by side, 400 jobs of edge-vision at 6 jobs/s;
# times are real seconds into each policy's run.
faults() {
  local base=(compass-celery bench cluster --workload dags/edge-vision.json --jobs 400
              --policies celery-default,compass --quiet)
  local -A cases=(
    [rolling-restart]="--rolling-restart-after 5"
    [kill-worker]="--kill-worker-after 10"
    [kill-restart]="--kill-restart 50 --jobs 1200"
    [restart-redis-aof]="--restart-redis-after 10 --redis-aof"
    [restart-redis-no-aof]="--restart-redis-after 10 --no-redis-aof"
    [pause-redis]="--pause-redis-after 10"
    [clock-skew]="--skew-clock-s 30"
    [long-task]="--long-task-s 20"
  )
  local name
  for name in rolling-restart kill-worker kill-restart restart-redis-aof restart-redis-no-aof pause-redis \
              clock-skew long-task; do
    # shellcheck disable=SC2086  # the flags split on purpose
    run "${base[@]}" ${cases[$name]} --json "$out/fault-$name.json" \
        | tee "$out/fault-$name.txt"
    mkdir -p "bench-out/fault-logs/$name" && cp bench-out/logs/*.log "bench-out/fault-logs/$name/"
    rm -f bench-out/logs/*.log
  done
  compass-celery bench fault-table "$out" | tee "$out/faults.md"
}

main() {
# 1. edge-vision at its default rate (6 jobs/s, 400 jobs), every policy
run compass-celery bench cluster --workload dags/edge-vision.json --quiet \
    --json "$out/edge-vision.json" --plot "$out/edge-vision.png" | tee "$out/edge-vision.txt"
# 2. light load (rate/4) for the lower-bound target
run compass-celery bench cluster --workload dags/edge-vision.json --rate 1.5 --jobs 150 \
    --policies compass,celery-default --quiet --json "$out/edge-vision-light.json" \
    | tee "$out/edge-vision-light.txt"
# 3. half the servers: compass on 2 and 1 workers, celery-default on 3, same arrivals
run compass-celery bench cluster --workload dags/edge-vision.json --workers 2 --policies compass,hash \
    --quiet --json "$out/edge-vision-2w.json" | tee "$out/edge-vision-2w.txt"
run compass-celery bench cluster --workload dags/edge-vision.json --workers 3 --policies celery-default \
    --quiet --json "$out/edge-vision-3w.json" | tee "$out/edge-vision-3w.txt"
# 4. the two workloads in dags/
run compass-celery bench cluster --workload dags/caption-translate.json --jobs 200 --quiet \
    --json "$out/caption-translate.json" --plot "$out/caption-translate.png" \
    | tee "$out/caption-translate.txt"
run compass-celery bench cluster --workload dags/vision-fanout.json --jobs 200 --quiet \
    --json "$out/vision-fanout.json" --plot "$out/vision-fanout.png" | tee "$out/vision-fanout.txt"
}

sim() {
# 6. simulator: the same planner on 1,000 workers; count_pending on and off
run compass-celery sim run --workload dags/edge-vision.json --workers 1000 --rate 1500 \
    --policies celery-default,jsq,hash,heft,compass \
    --jobs 10000 --json "$out/sim-1000.json" | tee "$out/sim-1000.txt"
run compass-celery sim run --workload dags/edge-vision.json --compare-pending \
    | tee "$out/sim-pending.txt"
}

hotpath() {
# 7. hot-path costs: planning time, one decision, enqueue, a Dag hop against a chain; then
# many producers reading the state of 64 and 1,000 workers
run compass-celery bench plan-timing | tee "$out/plan-timing.txt"
run compass-celery bench overhead | tee "$out/overhead.txt"
local args
# (a fourth number: --refresh-ahead, 0 for decisions that wait for their reads)
for args in "64 1 0.1" "64 32 0.1" "1000 1 0.1" "1000 32 0.1" "64 1 0" "1000 1 0" \
            "1000 1 0.1 0" "1000 32 0.1 0"; do
  set -- $args
  run compass-celery bench producers --records "$1" --producers "$2" --changing "$3" \
      --seconds 10 ${4:+--refresh-ahead "$4"} | tee "$out/producers-$1-$2-$3${4:+-ahead$4}.txt"
done
}

egress() {
# 7b. what producers' reads cost Redis as the fleet grows, with the change held fixed: no
# change at all (no record changes, reconciles that find no drift), then the same 256 record
# changes a second spread over 64 and over 1,000 workers; (a fourth number: --refresh-ahead,
# 0 for decisions that wait for their reads)
local args
for args in "64 1 0" "1000 1 0" "64 32 0" "1000 32 0" "64 1 1.0" "1000 1 0.064" \
            "64 1 0 0" "1000 1 0 0" "64 1 1.0 0" "1000 1 0.064 0"; do
  set -- $args
  run compass-celery bench producers --records "$1" --producers "$2" --changing "$3" \
      --drift 0 --seconds 10 ${4:+--refresh-ahead "$4"} \
      --json "$out/egress-$1-$2-$3${4:+-ahead$4}.json" | tee "$out/egress-$1-$2-$3${4:+-ahead$4}.txt"
done
# producers that decide once every 0.2 s each (web processes between requests), at the
# default churn (10% changing): kept fresh between decisions (the default), and not (a third
# number, --keep-fresh 0: past the snapshot's TTL and read-ahead every decision reads first)
for args in "64 32" "1000 32" "1000 8" "1000 1" "64 32 0" "1000 32 0" "1000 8 0" "1000 1 0"; do
  set -- $args
  run compass-celery bench producers --records "$1" --producers "$2" --changing 0.1 \
      --interval 0.2 --seconds 10 ${3:+--keep-fresh "$3"} \
      --json "$out/paced-$1-$2${3:+-kept$3}.json" | tee "$out/paced-$1-$2${3:+-kept$3}.txt"
done
# producers idle longer than compass_snapshot_keep_fresh_s between decisions (one every 2 s):
# each decision reads first
run compass-celery bench producers --records 1000 --producers 8 --changing 0.1 \
    --interval 2 --seconds 20 --json "$out/idle-1000-8.json" | tee "$out/idle-1000-8.txt"
}

cache() {
# 8. the model cache's eviction policy alone: same placement (jsq, compass), LRU vs look-ahead
for cp in lru lookahead; do
  run compass-celery bench cluster --workload dags/edge-vision.json --jobs 200 --policies jsq,compass \
      --cache-policy "$cp" --quiet --json "$out/cache-$cp.json" | tee "$out/cache-$cp.txt"
done
}

sweep() {
# 9. latency against load
run compass-celery bench cluster --workload dags/edge-vision.json --policies celery-default,hash,compass \
    --jobs 150 --sweep-rate 3,6,9,12 --quiet --json "$out/sweep.json" --plot "$out/sweep.png" \
    | tee "$out/sweep.txt"
}

multimodel() {
# 10. sustained load with many models: the simulator (with and without the demand-aware
# placement) and the real cluster against the simulator, at ~80% and ~40% utilisation and
# time scales 1.0 and 0.5
local rate
for rate in 5.38 2.69; do
  run compass-celery sim run --workload dags/multi-model.json --rate "$rate" \
      --json "$out/mm-sim-$rate.json" | tee "$out/mm-sim-$rate.txt"
  run compass-celery sim run --workload dags/multi-model.json --rate "$rate" --no-demand \
      --policies celery-default,round-robin,random,jsq,hash,heft,compass,static-replicas \
      --json "$out/mm-sim-nodemand-$rate.json" | tee "$out/mm-sim-nodemand-$rate.txt"
done
local ts
for ts in 1.0 0.5; do
  for rate in 5.38 2.69; do
    run compass-celery bench cluster --workload dags/multi-model.json --rate "$rate" --jobs 300 \
        --time-scale "$ts" --policies jsq,compass --compare-sim --quiet \
        --json "$out/mm-real-$rate-$ts.json" | tee "$out/mm-real-$rate-$ts.txt"
  done
done
}

regress() {
# 12. a quick check that the shipped workloads did not regress: compass and celery-default
# on each, the first at its default rate and job count, the others at 200 jobs
local wl jobs
for wl in edge-vision caption-translate vision-fanout; do
  jobs=200; [[ $wl == edge-vision ]] && jobs=400
  run compass-celery bench cluster --workload "dags/$wl.json" --jobs "$jobs" \
      --policies celery-default,compass --quiet --json "$out/regress-$wl.json" \
      | tee "$out/regress-$wl.txt"
done
}

amqp() {
# 11. RabbitMQ as the broker (compass state in a private Redis): a vhost of its own
local vhost="compass-bench-$$"
rabbitmqctl add_vhost "$vhost" >/dev/null
rabbitmqctl set_permissions -p "$vhost" guest ".*" ".*" ".*" >/dev/null
run compass-celery bench cluster --workload dags/edge-vision.json --jobs 200 \
    --broker "amqp://guest:guest@127.0.0.1:5672/$vhost" --quiet \
    --json "$out/edge-vision-amqp.json" | tee "$out/edge-vision-amqp.txt" || true
rabbitmqctl delete_vhost "$vhost" >/dev/null
}

real() {
# 13. real compute: the packaged pretrained models on the CPU (needs the real extra), every
# term the planner predicted against what the workers measured, the simulator fed the
# measured costs; then the prepared device check on the cpu device
run compass-celery bench cluster --real --workload dags/voice-real.json \
    --policies celery-default,jsq,compass --compare-sim --quiet \
    --json "$out/voice-real.json" | tee "$out/voice-real.txt"
run compass-celery device-check --device cpu --jobs 0 --json "$out/device-cpu.json" \
    | tee "$out/device-cpu.txt"
}

realsim() {
# 14. the emulated cluster against its simulator: compass on every shipped workload and two
# generated many-model ones (80% load), 300 jobs, time scales 1.0 and 0.5; each on the
# workload's own arrivals and on two more seeds, so rare events (model loads) are pooled
local wl ts seed args tag
mkdir -p "$out/realsim"
for ts in 1.0 0.5; do
  for wl in edge-vision caption-translate vision-fanout multi-model generated-9m-s3 \
            generated-9m-s13; do
    for seed in own 1 2; do
      args=(); tag="$wl-$ts"
      [[ $seed == own ]] || { args=(--seed "$seed"); tag="$wl-$ts-s$seed"; }
      run compass-celery bench cluster --workload "dags/$wl.json" --policies compass --jobs 300 \
          --time-scale "$ts" "${args[@]}" --compare-sim --quiet \
          --json "$out/realsim/$tag.json" | tee "$out/realsim/$tag.txt"
    done
  done
done
}

slo() {
# 15. serving an SLO under overload: edge-vision with every job in class interactive (400 ms
# deadline), at the knee (16 jobs/s) and twice it, time scale 1.0, 600 jobs; compass and jsq
# with admission on and off, and plain Celery with expires= at each job's deadline
rm -rf "$out/slo/before-headroom"
local rate adm policies
for rate in 16 32; do
  for adm in on off; do
    policies=compass,jsq; [[ $adm == on ]] && policies=compass,jsq,celery-expires
    run compass-celery bench cluster --workload "$out/slo/edge-vision-slo.json" --rate "$rate" \
        --jobs 600 --time-scale 1.0 --policies "$policies" --admission "$adm" --quiet \
        --json "$out/slo/edge-vision-$rate-$adm.json" | tee "$out/slo/edge-vision-$rate-$adm.txt"
  done
done
# the bursty mixed workload: interactive and batch classes, bursts at about twice capacity
run compass-celery bench cluster --workload dags/bursty-mixed.json --time-scale 1.0 \
    --policies compass,jsq,celery-expires --quiet --json "$out/slo/bursty-mixed.json" \
    | tee "$out/slo/bursty-mixed.txt"
compass-celery bench slo-table "$out/slo" | tee "$out/slo/tables.md"
# the simulator on the same workload, at 4 and 1,000 workers (rates scaled to match)
for rate in 16 32; do
  run compass-celery sim run --workload "$out/slo/edge-vision-slo.json" --rate "$rate" \
      --jobs 2000 --policies compass,jsq,celery-default | tee "$out/slo/sim-$rate.txt"
done
for rate in 4000 8000; do
  run compass-celery sim run --workload "$out/slo/edge-vision-slo.json" --rate "$rate" \
      --workers 1000 --jobs 20000 --policies compass,jsq \
      | tee "$out/slo/sim-1000w-$rate.txt"
done
}

# 16. interactive work under a batch flood, on Redis and on RabbitMQ (a vhost of its own)
flood() {
mkdir -p "$out/flood"
python -c "from tests.support.amqp_fixtures import create_vhost; create_vhost('compass-flood')"
run compass-celery bench flood --seconds 30 --broker redis \
    --broker amqp://guest:guest@127.0.0.1:5672/compass-flood --json "$out/flood/flood.json" \
    | tee "$out/flood/flood.txt"
}

# 17. a long soak: key count, Redis memory and worker RSS over ten minutes, Redis restarted
soak() {
mkdir -p "$out/soak"
run compass-celery bench soak --minutes 10 --rate 2 --workers 2 --job-ttl-s 60 \
    --restart-redis-at-s 300 --sample-s 5 --json "$out/soak/soak-10min.json" \
    | tee "$out/soak/soak-10min.txt"
}

# 18. batching: the rate each variant sustains within a 300 ms p99, in the simulator, on
# real workers with emulated GPUs (time scale 5), and on real compute (MiniLM, CPU)
batching() {
run compass-celery sim batching --workload dags/batch-embed.json --jobs 6000 \
    | tee "$out/batching-sim.txt"
run compass-celery bench batching --workload dags/batch-embed.json \
    --rates 100,200,300,400,500,600,700 --jobs 1000 --time-scale 5 --compare-sim \
    --json "$out/batching-emulated.json" | tee "$out/batching-emulated.txt"
run compass-celery bench batching --workload dags/batch-embed.json \
    --rates 450,500,550,600,650 --jobs 2000 --time-scale 5 --variants compass+batch,compass+blind \
    --json "$out/batching-emulated-fine.json" | tee "$out/batching-emulated-fine.txt"
run compass-celery bench batching --real --workload dags/embed-real.json \
    --rates 40,80,120,160,200,240 --jobs 600 --compare-sim \
    --json "$out/batching-real.json" | tee "$out/batching-real.txt"
run compass-celery bench batching --real --workload dags/embed-real.json \
    --rates 40,60,80,100,120 --jobs 600 --compare-sim \
    --json "$out/batching-real-fine.json" | tee "$out/batching-real-fine.txt"
# under a deadline, admission on: goodput, where placement's view of batches decides
# what is admitted
run compass-celery bench batching --workload dags/batch-embed.json \
    --rates 200,300,400,500,600 --jobs 1500 --time-scale 5 --deadline-ms 100 --compare-sim \
    --json "$out/batching-deadline-emulated.json" | tee "$out/batching-deadline-emulated.txt"
run compass-celery bench batching --real --workload dags/embed-real.json \
    --rates 120,160,200,240 --jobs 600 --deadline-ms 300 --compare-sim \
    --json "$out/batching-deadline-real.json" | tee "$out/batching-deadline-real.txt"
run compass-celery sim batching --workload dags/batch-embed.json --jobs 6000 \
    --rates 200,400,600,800 --deadline-ms 100 | tee "$out/batching-deadline-sim.txt"
}

# Every section by default; or only those named: docs/run_benchmarks.sh hotpath multimodel
sections=("$@")
((${#sections[@]})) || sections=(main faults sim hotpath egress cache sweep multimodel amqp regress
                                 real realsim slo flood soak batching)
for section in "${sections[@]}"; do "$section"; done
