-- wrk script for bench/run.sh. Configured by environment variables:
--   BENCH_BODY   path of a body file containing the marker @@UNIQ@@ (bench/bodies.py); empty
--                with BENCH_METHOD=GET
--   BENCH_METHOD POST (default) or GET
--   BENCH_UNIQUE 1: a unique id per request replaces the marker (cache-miss mode); otherwise
--                the marker is replaced once by a fixed id and wrk sends the same bytes again
--   BENCH_NONCE  makes ids unique across runs (run.sh passes a fresh one per run)
--   BENCH_LIMIT  when > 0, each wrk thread stops after this many responses (soak mode)
-- done() prints one machine-readable line: BENCH requests=.. duration_us=.. rps=.. p50_us=..
local method = os.getenv("BENCH_METHOD") or "POST"
local unique = os.getenv("BENCH_UNIQUE") == "1"
local nonce = os.getenv("BENCH_NONCE") or "0"
local limit = tonumber(os.getenv("BENCH_LIMIT") or "0") or 0
local path = os.getenv("BENCH_PATH") or "/v1/chat/completions"

local prefix, suffix = "", ""
local body_file = os.getenv("BENCH_BODY") or ""
if body_file ~= "" then
  local f = assert(io.open(body_file, "rb"))
  local text = f:read("*a")
  f:close()
  local s, e = string.find(text, "@@UNIQ@@", 1, true)
  assert(s, "no @@UNIQ@@ marker in " .. body_file)
  prefix, suffix = string.sub(text, 1, s - 1), string.sub(text, e + 1)
end

local threads = {}
local counter = 0
local responses = 0
tid = 0 -- a global: setup() sets it in each thread's Lua state

function setup(thread)
  thread:set("tid", #threads + 1)
  table.insert(threads, thread)
end

local headers = { ["Content-Type"] = "application/json" }

function init(args)
  wrk.method = method
  wrk.path = path
  wrk.headers["Content-Type"] = "application/json"
  if method == "POST" and not unique then
    wrk.body = prefix .. "static-0" .. suffix
  elseif method ~= "POST" then
    wrk.body = nil
    wrk.headers["Content-Type"] = nil
  end
end

if unique then
  function request()
    counter = counter + 1
    local id = nonce .. "-" .. tostring(tid) .. "-" .. tostring(counter)
    return wrk.format("POST", path, headers, prefix .. id .. suffix)
  end
end

if limit > 0 then
  function response(status, hdrs, body)
    responses = responses + 1
    if responses >= limit then
      wrk.thread:stop()
    end
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  local secs = summary.duration / 1e6
  io.write(string.format(
    "BENCH requests=%d duration_us=%d rps=%.1f p50_us=%d p90_us=%d p99_us=%d mean_us=%.0f max_us=%d " ..
    "err_connect=%d err_read=%d err_write=%d err_status=%d err_timeout=%d bytes=%d\n",
    summary.requests, summary.duration, summary.requests / secs,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean,
    latency.max, e.connect, e.read, e.write, e.status, e.timeout, summary.bytes))
end
