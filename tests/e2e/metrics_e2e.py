#!/usr/bin/env python3
"""`rpc-server --metrics` during a real generation, against what the stock client sent.

Stock `llama-completion` generates 48 tokens of gemma-3-270m through a frame-counting proxy
(e2e_common.CountingProxy: splits the client's bytes into `| cmd | size | payload |` frames) to
`rpc-server --metrics`, while the test scrapes http://.../metrics every 100 ms. Checks:
- scrapes during the generation parse, and every counter only grows between scrapes;
- a scrape during the generation already shows the connection open and tokens counted;
- after the client is gone: per command, the count and the request bytes equal the proxy's, the
  reply bytes over all commands equal what the proxy carried back, the TCP transport's totals
  equal the same, and one token was timed per GRAPH_RECOMPUTE (the stock client reads the logits
  after each), with the non-compute part of each token no larger than the token.
Prints the per-token server-side time (mean, and the non-compute part). 'N passed, N failed'.

  python3 tests/e2e/metrics_e2e.py --stock-bin DIR [--ours target/release/rpc-server] [--model GGUF]
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_common import (Checks, CountingProxy, Server, Servers, add_completion_args, clean_env,  # noqa: E402
                        completion_cmd, free_port, log, resolve_completion)

PROMPT = "The capital of France is"
N_PREDICT = 48


def scrape(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5) as r:
        assert r.status == 200, r.status
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_completion_args(ap)
    a = ap.parse_args()
    stock, ours, model = resolve_completion(a)
    logdir = tempfile.mkdtemp(prefix="metrics-e2e-")
    check = Checks()

    with Servers() as servers:
        mport = free_port()
        srv = servers.add(Server("ours", ours, free_port(exclude=(mport,)), logdir, threads=2,
                                 extra=["--metrics", "127.0.0.1:%d" % mport]))
        base = scrape(mport)  # the readiness probe's connection is in here already
        proxy = CountingProxy(srv.port)
        cmd = completion_cmd(stock, model, PROMPT, N_PREDICT, proxy.endpoint)
        err = open(os.path.join(logdir, "completion.err"), "wb")
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                             env=clean_env())
        samples, monotonic = [], True
        while p.poll() is None:
            m = scrape(mport)
            if samples:
                prev = samples[-1]
                for k, v in prev.items():
                    counter = k.endswith(("_total", "_count", "_sum")) or "_bucket{" in k or "_total{" in k
                    if counter and m.get(k, 0) < v:
                        monotonic = False
                        log("counter went down: %s %s -> %s" % (k, v, m.get(k)))
            samples.append(m)
            time.sleep(0.1)
        rc = p.wait()
        check("llama-completion succeeded", rc == 0, "rc=%s (log %s)" % (rc, err.name))
        check("counters only grow between scrapes (%d scrapes during the generation)" % len(samples),
              monotonic and len(samples) >= 3, "scrapes=%d" % len(samples))
        during = [s for s in samples if s.get("rpc_connections_open", 0) >= 1 and s.get("rpc_token_seconds_count", 0) > 0]
        check("a scrape during the generation shows an open connection and timed tokens", bool(during))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and scrape(mport).get("rpc_connections_open", 1) != 0:
            time.sleep(0.1)
        m = scrape(mport)
        cmds = dict(proxy.commands)
        bad = []
        for name, (count, nbytes) in sorted(cmds.items()):
            got_n = m.get('rpc_commands_total{command="%s"}' % name, 0)
            got_b = m.get('rpc_command_received_bytes_total{command="%s"}' % name, 0)
            if got_n != count or got_b != nbytes:
                bad.append("%s: proxy %d cmds %d bytes, metrics %d cmds %d bytes" % (name, count, nbytes, got_n, got_b))
        extra = [k for k in m if k.startswith("rpc_commands_total{")
                 and k.split('"')[1] not in cmds and m[k] != base.get(k, 0)]
        check("per command: count and request bytes equal the proxy's (%d commands, %d kinds)"
              % (sum(c for c, _ in cmds.values()), len(cmds)), not bad and not extra, "; ".join(bad + extra))
        sent = sum(v for k, v in m.items() if k.startswith("rpc_command_sent_bytes_total{"))
        check("reply bytes equal what the proxy carried back (%d)" % proxy.down, sent == proxy.down,
              "metrics %d" % sent)
        check("TCP transport totals equal the proxy's (%d up, %d down)" % (proxy.up, proxy.down),
              m.get('rpc_transport_received_bytes_total{transport="TCP"}') == proxy.up
              and m.get('rpc_transport_sent_bytes_total{transport="TCP"}') == proxy.down,
              "metrics %s / %s" % (m.get('rpc_transport_received_bytes_total{transport="TCP"}'),
                                   m.get('rpc_transport_sent_bytes_total{transport="TCP"}')))
        recomputes = cmds.get("GRAPH_RECOMPUTE", [0])[0]
        tokens = m.get("rpc_token_seconds_count", 0)
        check("one timed token per GRAPH_RECOMPUTE (%d)" % recomputes,
              recomputes > 0 and tokens == recomputes
              and m.get("rpc_token_non_compute_seconds_count") == tokens
              and m.get("rpc_token_non_compute_seconds_sum", 0) <= m.get("rpc_token_seconds_sum", 0),
              "tokens %s" % tokens)
        if tokens:
            total = m["rpc_token_seconds_sum"] / tokens * 1e3
            non = m["rpc_token_non_compute_seconds_sum"] / tokens * 1e6
            log("per token, server side: %.3f ms, of which not compute: %.1f us (%d tokens)" % (total, non, tokens))
        proxy.close()
        srv.stop()
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
