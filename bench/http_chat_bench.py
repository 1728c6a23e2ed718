#!/usr/bin/env python3
"""HTTP door throughput: N concurrent clients, each one chat session over the OpenAI door
(1 completion that creates it, then 3 that continue it with the whole conversation),
greedy, EOS ignored; prints the aggregate completion tokens per second per repetition.
Standard library only.

  bench/http_chat_bench.py --server build/bin/echokv-server [--clients 16] [--reps 2]
"""
import argparse, json, os, re, subprocess, tempfile, threading, time, urllib.error, urllib.request

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--server", required=True, help="echokv-server binary")
ap.add_argument("--model", default=os.path.join(os.environ.get("ECHOKV_TEST_DATA", "../shared"), "models/stories260K"))
ap.add_argument("--clients", type=int, default=16)
ap.add_argument("--reps", type=int, default=2)
ap.add_argument("--threads", default="1", help="--threads of the server")
args = ap.parse_args()
server = args.server
d = tempfile.mkdtemp()
pf = os.path.join(d, "port")
p = subprocess.Popen([server, "--model", args.model, "--insecure", "--port", "0",
                      "--port-file", pf, "--http_port", "0", "--threads", args.threads, "--max_concurrent_streams", "64", "--chat_template", "builtin:chatml"],
                     stdout=subprocess.DEVNULL, stderr=open(os.path.join(d, "log"), "w"))
for _ in range(300):
    if os.path.exists(pf) and open(pf).read().strip(): break
    time.sleep(0.1)
ports = open(pf).read().split()
log = open(os.path.join(d, "log")).read()
http = int(re.search(r"HTTP API on port (\d+)", log).group(1))
def post(body, headers={}):
    req = urllib.request.Request(f"http://127.0.0.1:{http}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req) as r:
            return json.loads(r.read()), r.headers
    except urllib.error.HTTPError as e:
        print("ERR", e.code, e.read()[:300]); raise
msgs = [{"role": "user", "content": "Once upon a time there was a little dog who liked to run in the park. "}]
def body(m, sid=None):
    b = {"model": "echokv", "messages": m, "max_tokens": 32, "temperature": 0, "ignore_eos": True}
    if sid: b["session_id"] = sid
    return b
results = {}
def worker(i):
    toks = 0
    r, h = post(body(msgs, "new")); toks += r["usage"]["completion_tokens"]; sid = r["session_id"]
    conv = msgs + [r["choices"][0]["message"]]
    for t in range(3):
        conv = conv + [{"role": "user", "content": "and then?"}]
        r, h = post(body(conv, sid)); toks += r["usage"]["completion_tokens"]
        conv = conv + [r["choices"][0]["message"]]
    results[i] = toks
for rep in range(args.reps):
    results.clear()
    t0 = time.time()
    th = [threading.Thread(target=worker, args=(i,)) for i in range(args.clients)]
    [t.start() for t in th]; [t.join() for t in th]
    dt = time.time() - t0
    print(f"{server} rep {rep}: {args.clients} clients x 4 chat turns (1 new + 3 continued), "
          f"{sum(results.values())} tokens in {dt:.2f} s = {sum(results.values())/dt:.1f} tok/s, load {open('/proc/loadavg').read().split()[0]}")
p.terminate(); p.wait()
