-- wrk script for scripts/loadtest.sh: POSTs infini-gram API queries to `infgram serve`, stops
-- by itself after LIMIT responses, and tallies the answers.
--   wrk ... -s scripts/loadtest.lua URL -- LIMIT MODE INDEX
-- MODE `count`: one count query, over and over. MODE `mixed`: every query type, and every
-- tenth request malformed (each kind of malformation in turn).
-- A 200 must carry "latency" and no "error"; a 4xx must carry "error"; any 5xx is counted.

local threads = {}

-- Microseconds, for the request rate over the requests actually made (wrk's own duration is
-- its -d bound, even when the run stopped earlier at LIMIT).
local ffi = require("ffi")
ffi.cdef [[
  typedef struct { long tv_sec; long tv_usec; } timeval_t;
  int gettimeofday(timeval_t *tv, void *tz);
]]
local tv = ffi.new("timeval_t")
local function now_us()
  ffi.C.gettimeofday(tv, nil)
  return tonumber(tv.tv_sec) * 1e6 + tonumber(tv.tv_usec)
end

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  limit = tonumber(args[1]) or 100000
  mode = args[2] or "count"
  local index = args[3] or "ts"
  responses, ok, client_errors, server_errors, wrong, i = 0, 0, 0, 0, 0, 0
  first_us, last_us = 0, 0
  local function q(fields)
    return '{"index":"' .. index .. '",' .. fields .. '}'
  end
  good = {
    q('"query_type":"count","query":"ROMEO:"'),
    q('"query_type":"prob","query":"To be, or not to be"'),
    q('"query_type":"ntd","query":"First Citizen"'),
    q('"query_type":"infgram_prob","query":"xyzzy And what is he"'),
    q('"query_type":"infgram_ntd","query":"my lord"'),
    q('"query_type":"find","query":"Juliet"'),
    q('"query_type":"count","query":"Romeo AND Juliet"'),
    q('"query_type":"search_docs","query":"king OR queen","maxnum":2,"max_disp_len":50'),
    q('"query_type":"longest_match","query":"Now is the winter of our discontent"'),
    q('"query_type":"attribute","query":"What light through yonder window breaks? It is the east"'),
    q('"query_type":"creativity","query":"My kingdom for a horse, and a sword for my brother"'),
    q('"query_type":"get_doc_by_rank","rank":1000,"max_disp_len":40'),
    q('"query_type":"get_doc_by_ptr","ptr":5000,"max_disp_len":40'),
  }
  bad = {
    'this is not json',
    '[1, 2, 3]',
    q('"query_type":"nonsense","query":"x"'),
    '{"index":"no-such-index","query_type":"count","query":"x"}',
    q('"query_type":"count","query":42'),
    q('"query_type":"count","query_ids":[-1]'),
    q('"query_type":"count","query":"' .. string.rep("x", 1200) .. '"'),
    q('"query_type":"search_docs","query":"a","maxnum":99'),
    q('"query_type":"count","query":"a AND b AND c AND d AND e"'),
    q('"query_type":"prob","query":""'),
    q('"query_type":"get_doc_by_ptr"'),
  }
end

function request()
  i = i + 1
  if i == 1 then
    first_us = now_us()
  end
  local body
  if mode == "count" then
    body = good[1]
  elseif i % 10 == 0 then
    body = bad[math.floor(i / 10) % #bad + 1]
  else
    body = good[i % #good + 1]
  end
  return wrk.format("POST", "/", { ["Content-Type"] = "application/json" }, body)
end

function response(status, headers, body)
  responses = responses + 1
  if status == 200 then
    ok = ok + 1
    if not string.find(body, '"latency"', 1, true) or string.find(body, '"error"', 1, true) then
      wrong = wrong + 1
    end
  elseif status >= 400 and status < 500 then
    client_errors = client_errors + 1
    if not string.find(body, '"error"', 1, true) then
      wrong = wrong + 1
    end
  else
    server_errors = server_errors + 1
  end
  last_us = now_us()
  if responses >= limit then
    wrk.thread:stop()
  end
end

function done(summary, latency, requests)
  local t = { responses = 0, ok = 0, client_errors = 0, server_errors = 0, wrong = 0 }
  local first, last = math.huge, 0
  for _, thread in ipairs(threads) do
    for k, _ in pairs(t) do
      t[k] = t[k] + thread:get(k)
    end
    first = math.min(first, thread:get("first_us"))
    last = math.max(last, thread:get("last_us"))
  end
  local seconds = math.max(last - first, 1) / 1e6
  io.write(string.format(
    "RESULT responses=%d ok=%d 4xx=%d 5xx=%d wrong=%d socket_errors=%d rps=%.0f p50_ms=%.3f p99_ms=%.3f max_ms=%.3f\n",
    t.responses, t.ok, t.client_errors, t.server_errors, t.wrong,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    t.responses / seconds, latency:percentile(50) / 1e3, latency:percentile(99) / 1e3,
    latency.max / 1e3))
end
