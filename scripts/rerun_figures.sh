#!/usr/bin/env bash
# Figs. 7-9, one run at a time, each archived as soon as it ends well (docs/results/runs/<archive>/<run>:
# metrics.json, summary.json, .hydra). A run already archived is skipped, so the script resumes where a stopped one
# left off; a run with a failed or missing home, or that stopped before its time limit, is tried once more and never
# archived. Stop it to free the machine with SIGTERM to its session (the run under way stops its SuperLink and Ray
# within a minute; wait for them; the unfinished run is made again on resume). A run frozen with SIGSTOP for minutes
# outlives Flower's message TTL and is not archived.
#   bash scripts/rerun_figures.sh [paper7] [paper8] [paper9] [fig7] [fig8] [fig9] [fedat_weights] [ablations]
#   bash scripts/rerun_figures.sh paper7_sync paper8 paper9 paper7_fedasync   # the long FedAsync runs last
# paper7-9 (the default): the paper's conditions, synchronous rounds that wait for every home (conf/experiment's
# defaults), Fig. 7 to 600 virtual s and Figs. 8-9 to 300 s, into <figure>_paper_conditions. fig7-9: the deadline
# variant as archived in <figure>_<time>_closing_rule (rounds close at centre + RT). fedat_weights: the FedAT
# ablation beside Fig. 8 on RLG-IID. ablations: Fig. 7 in the paper's conditions with one factor changed, seed 0
# (issue 39: which difference keeps Eco-FL from beating FedAsync), each into fig7_ablation_<factor>; compare each
# with its seed-0 runs in fig7_paper_conditions (python -m simulations.claims ... --seeds 0 --until 300).
set -uo pipefail
cd "$(dirname "$0")/.."
export RAY_memory_usage_threshold=0.98  # Ray's memory monitor otherwise kills an actor on this 24 GiB machine
SCRATCH=multirun/rerun_figures

ended_well() {  # summary.json
  .venv/bin/python -c "import json, sys; d = json.load(open(sys.argv[1])); sys.exit(0 if d['failed_total'] == 0 \
and d['homes_answered'] == d['num_homes'] and d['stop_reason'] == 'max_virtual_time_s' else 1)" "$1"
}

run() {  # archive run-name overrides...
  local archive=$1 name=$2
  shift 2
  local dest=docs/results/runs/$archive/$name scratch=$SCRATCH/$archive
  [ -f "$dest/summary.json" ] && return 0
  for attempt in 1 2; do
    rm -rf "${scratch:?}/$name"
    echo "$(date +%T) start $archive/$name (attempt $attempt)"
    .venv/bin/python -m simulations.run -m "$@" "hydra.sweep.dir=$scratch" "hydra.sweep.subdir='$name'" \
      > "$SCRATCH/last.log" 2>&1
    # A run whose process was stopped (SIGSTOP) longer than Flower's message TTL lost messages: never archived.
    if [ -f "$scratch/$name/summary.json" ] && ended_well "$scratch/$name/summary.json" \
        && ! grep -q "TTL has expired" "$scratch/$name/run.log" 2>/dev/null; then
      mkdir -p "$dest"
      cp -r "$scratch/$name/.hydra" "$scratch/$name/metrics.json" "$scratch/$name/summary.json" "$dest/"
      # a long run's rows are gzipped (simulations.plot.read_metrics reads either): no file in git over 2 MiB
      [ "$(stat -c %s "$dest/metrics.json")" -le $((1 << 20)) ] || gzip -9n "$dest/metrics.json"
      echo "$(date +%T) archived $dest"
      return 0
    fi
    echo "$(date +%T) failed $archive/$name:"
    tail -5 "$SCRATCH/last.log"
  done
}

FIG7_STRATEGIES=(fedavg fedasync fedat ecofl ecofl_wo_dg)  # a run's number is its strategy's index here

figure7() {  # archive, the strategies to run (default all), then overrides for every run
  local archive=$1 strategies=${2:-${FIG7_STRATEGIES[*]}}
  shift 2
  for seed in 0 1 2; do
    for i in "${!FIG7_STRATEGIES[@]}"; do
      local strategy=${FIG7_STRATEGIES[$i]}
      [[ " $strategies " == *" $strategy "* ]] || continue
      run "$archive" "$seed${i}_seed=$seed,strategy=$strategy" +experiment=fig7 seed=$seed strategy=$strategy "$@"
    done
  done
}

figure8() {
  local archive=$1
  shift
  for seed in 0 1 2; do
    local i=0
    for partition in rlg_niid rlg_iid; do
      for strategy in ecofl fedat astraea; do
        run "$archive" "$seed${i}_partition=$partition,seed=$seed,strategy=$strategy" \
          +experiment=fig8 partition=$partition seed=$seed strategy=$strategy "$@"
        i=$((i + 1))
      done
    done
  done
}

figure9() {
  local archive=$1
  shift
  for seed in 0 1 2; do
    local i=0
    for lambda in 0 1 3 10 30 100 300; do
      run "$archive" "$seed${i}_grouping.lambda=$lambda,seed=$seed" +experiment=fig9 grouping.lambda=$lambda \
        seed=$seed "$@"
      i=$((i + 1))
    done
  done
}

paper7() { figure7 fig7_paper_conditions "${FIG7_STRATEGIES[*]}"; }
# The synchronous strategies first (the waiting rounds change them), FedAsync after (no rounds: the paper's
# conditions leave it as the deadline variant has it; at 600 s a run takes about two hours here)
paper7_sync() { figure7 fig7_paper_conditions "fedavg fedat ecofl ecofl_wo_dg"; }
paper7_fedasync() { figure7 fig7_paper_conditions "fedasync"; }
paper8() { figure8 fig8_paper_conditions; }
paper9() { figure9 fig9_paper_conditions; }
fig7() { figure7 fig7_300s_closing_rule "${FIG7_STRATEGIES[*]}" +variant=deadline loop.max_virtual_time_s=300; }
fig8() { figure8 fig8_200s_closing_rule +variant=deadline loop.max_virtual_time_s=200; }
fig9() { figure9 fig9_200s_closing_rule +variant=deadline loop.max_virtual_time_s=200; }

fedat_weights() {  # the ablation beside Fig. 8 on RLG-IID: FedAT with every tier weighed 1/M
  for seed in 0 1 2; do
    run fig8_fedat_equal_weights "${seed}0_partition=rlg_iid,seed=$seed,strategy=fedat_equal_weights" \
      +experiment=fig8 +variant=deadline loop.max_virtual_time_s=200 partition=rlg_iid seed=$seed \
      strategy=fedat_equal_weights
  done
}

ablations() {  # one factor at a time, on seed 0, cheapest first; FedAsync has no rounds and no grouping
  run fig7_ablation_latency_seconds "03_seed=0,strategy=ecofl" +experiment=fig7 seed=0 strategy=ecofl \
    grouping.latency_units=seconds loop.max_virtual_time_s=300
  # FedAvg has no group rounds (it samples max_concurrent homes a round): homes_per_round is Eco-FL's alone
  run fig7_ablation_homes_per_round "03_seed=0,strategy=ecofl" +experiment=fig7 seed=0 strategy=ecofl \
    loop.homes_per_round=10 loop.max_virtual_time_s=300
  for i in 0 3 1; do
    local strategy=${FIG7_STRATEGIES[$i]}
    run fig7_ablation_churn "0${i}_seed=0,strategy=$strategy" +experiment=fig7 seed=0 strategy=$strategy \
      latency.change_prob=0.5 loop.max_virtual_time_s=300
  done
  for i in 3 1 0; do  # the paper's lr, to twice Fig. 7's 600 s (it moves the CNN slowly); Eco-FL and FedAsync first
    local strategy=${FIG7_STRATEGIES[$i]}
    run fig7_ablation_lr_1e-4 "0${i}_seed=0,strategy=$strategy" +experiment=fig7 seed=0 strategy=$strategy \
      train.lr=0.0001 loop.max_virtual_time_s=1200
  done
}

mkdir -p "$SCRATCH"
for figure in ${@:-paper7 paper8 paper9}; do
  case $figure in
    paper7 | paper7_sync | paper7_fedasync | paper8 | paper9 | fig7 | fig8 | fig9 | fedat_weights | ablations)
      "$figure" ;;
    *) echo "unknown figure: $figure (paper7[_sync|_fedasync], paper8, paper9, fig7, fig8, fig9, fedat_weights or" \
         "ablations)" >&2
       exit 2 ;;
  esac
done
echo "$(date +%T) done"
