-- wrk script for contrib/bench/run.py: POST one small chat completion request.
--
-- Environment:
--   BENCH_STREAM=1   send "stream": true (latency is then the whole SSE stream)
--   BENCH_MODEL      model name (default "bench")
--   BENCH_API        "responses": the same prompt as an OpenAI Responses API request
--                    (POST it to /v1/responses); else a chat completion request
--   BENCH_KEY        an API key, sent as "Authorization: Bearer <key>" (the full profile)
--   BENCH_HEADERS    extra request headers, one "Name: value" per line (lines separated
--                    by newlines, blank lines ignored), e.g. for a peer gateway
--                    (contrib/bench/peers.py): "x-portkey-provider: openai\n...".
--                    Applied after BENCH_KEY and Content-Type: a line naming one of
--                    them (in any case) replaces it. A line without a colon is an
--                    error (wrk reports it and prints no BENCH_JSON line).
--   BENCH_DISTINCT   a word unique to this wrk run: every request's prompt then ends with
--                    "#<word>-<thread>-<counter>", so no two requests are alike (a response
--                    cache misses every one). wrk then builds each request in request().
--   BENCH_PORTS      ports of 127.0.0.1, comma-separated: wrk's threads connect to them
--                    in turn (thread 1 to the first, thread 2 to the second, ...), so that
--                    -t2 splits the load between two gateways (the Host header is the URL's)
--
-- done() prints one machine-readable line, "BENCH_JSON {...}", that run.py parses.
-- Latencies are in microseconds. errors.status counts HTTP responses >= 400
-- (wrk's own definition), so non-2xx answers are reported, not hidden.

local stream = os.getenv("BENCH_STREAM") == "1"
local model = os.getenv("BENCH_MODEL") or "bench"

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local key = os.getenv("BENCH_KEY")
if key and key ~= "" then
    wrk.headers["Authorization"] = "Bearer " .. key
end
local extra = os.getenv("BENCH_HEADERS")
if extra and extra ~= "" then
    for line in string.gmatch(extra, "[^\r\n]+") do
        local name, value = string.match(line, "^%s*([^:]-)%s*:%s*(.-)%s*$")
        if name and name ~= "" then
            for existing in pairs(wrk.headers) do  -- header names are case-insensitive
                if string.lower(existing) == string.lower(name) then
                    wrk.headers[existing] = nil
                end
            end
            wrk.headers[name] = value
        elseif string.match(line, "%S") then
            error("BENCH_HEADERS: not a 'Name: value' line: " .. line)
        end
    end
end
local head, tail
if os.getenv("BENCH_API") == "responses" then
    head = '{"model":"' .. model .. '","input":"Say hello in ten words.'
    tail = '"' .. (stream and ',"stream":true' or '') .. '}'
else
    head = '{"model":"' .. model .. '",'
        .. '"messages":[{"role":"user","content":"Say hello in ten words.'
    tail = '"}]' .. (stream and ',"stream":true' or '') .. '}'
end
wrk.body = head .. tail

local threads = 0
local ports = {}
for port in string.gmatch(os.getenv("BENCH_PORTS") or "", "%d+") do
    table.insert(ports, port)
end

function setup(thread)
    threads = threads + 1
    thread:set("thread_number", threads)
    if #ports > 0 then
        thread.addr = wrk.lookup("127.0.0.1", ports[(threads - 1) % #ports + 1])[1]
    end
end

local distinct = os.getenv("BENCH_DISTINCT")
if distinct and distinct ~= "" then
    local counter = 0
    function request()
        counter = counter + 1
        local mark = " #" .. distinct .. "-" .. tostring(thread_number) .. "-" .. counter
        return wrk.format(nil, nil, nil, head .. mark .. tail)
    end
end

function done(summary, latency, requests)
    local e = summary.errors
    local seconds = summary.duration / 1e6
    io.write(string.format(
        'BENCH_JSON {"requests":%d,"duration_us":%d,"bytes":%d,"rps":%.3f,'
            .. '"p50_us":%d,"p90_us":%d,"p99_us":%d,"mean_us":%.1f,"max_us":%d,'
            .. '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d}}\n',
        summary.requests, summary.duration, summary.bytes, summary.requests / seconds,
        latency:percentile(50), latency:percentile(90), latency:percentile(99),
        latency.mean, latency.max,
        e.connect, e.read, e.write, e.status, e.timeout))
end
