#!/bin/bash
# POST->201 and POST->first frame over N pushes per configuration.
# usage: bench_latency.sh N   (writes logs/bench_*.log, prints a table)
cd /tmp/spike; PY=/work/main/.venv/bin/python; N=${1:-5}
run() {  # name server-args pub-args
  name=$1; sargs=$2; pargs=$3
  $PY whip_server.py --port 8093 --run-for $((N*6+10)) $sargs > logs/bench_${name}_server.log 2>&1 &
  spid=$!; sleep 2
  for i in $(seq 1 $N); do timeout 30 $PY pub_ffmpeg.py http://127.0.0.1:8093/whip --seconds 1 $pargs > logs/bench_${name}_pub_$i.log 2>&1; done
  kill $spid; wait $spid 2>/dev/null
  $PY - "$name" logs/bench_${name}_server.log <<'PYEOF'
import json, sys, statistics as st
name, path = sys.argv[1], sys.argv[2]
by = {}
for line in open(path):
    if not line.startswith("EVT "): continue
    d = json.loads(line[4:])
    if "sid" not in d: continue
    s = by.setdefault(d["sid"], {})
    if d["evt"] == "answer_201": s["201"] = d["ms"]
    if d["evt"] == "dtls_state" and d["state"] == "connected": s["dtls"] = d["ms"]
    if d["evt"] == "first_frame": s.setdefault("ff_" + d["kind"], d["ms"])
def col(k):
    v = [s[k] for s in by.values() if k in s]
    return f"{st.median(v):7.1f} [{min(v):.0f}-{max(v):.0f}]" if v else "-"
print(f"{name:22} n={len(by)}  201: {col('201')}  dtls_connected: {col('dtls')}  first_video: {col('ff_video')}  first_audio: {col('ff_audio')}")
PYEOF
}
run stock_active_answer "" ""
run kick_active_answer "--dtls-kick 20,60,150,300,600" ""
run pub_dtls_active "" "--dtls-active"
run kick_tap_mode "--dtls-kick 20,60,150,300,600 --mode tap" ""
