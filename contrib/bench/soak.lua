-- wrk script for contrib/bench/soak.py: a mix of calls, decided by a counter per thread.
--
-- Of every 10 requests a thread sends:
--   3  chat, not streamed, a prompt no other request has   (a cache miss, stored)
--   3  chat, streamed, a prompt no other request has       (a cache miss, stored)
--   2  chat on the model "failover", whose first line fails a share of its calls
--      (the fake's standing condition): the chain moves to the next line; one of
--      the two streamed
--   2  chat with one of 8 fixed prompts, one of the two streamed (cache hits, after
--      the first of each)
-- Aborted streams come from soak.py's own client, beside wrk.
--
-- Environment: SOAK_KEY (the API key), SOAK_WORD (a word of this run's own, so that
-- no prompt repeats one of an earlier run). done() prints "BENCH_JSON {...}" as
-- post.lua does.

local key = os.getenv("SOAK_KEY") or ""
local word = os.getenv("SOAK_WORD") or "soak"

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
if key ~= "" then
    wrk.headers["Authorization"] = "Bearer " .. key
end

local threads = 0
function setup(thread)
    threads = threads + 1
    thread:set("thread_number", threads)
end

local counter = 0

local function body(model, prompt, stream)
    return '{"model":"' .. model .. '","messages":[{"role":"user","content":"'
        .. prompt .. '"}]' .. (stream and ',"stream":true' or '') .. '}'
end

function request()
    counter = counter + 1
    local kind = counter % 10
    local unique = "Say hello in ten words. #" .. word .. "-" .. tostring(thread_number)
        .. "-" .. counter
    local text
    if kind <= 2 then
        text = body("bench", unique, false)
    elseif kind <= 5 then
        text = body("bench", unique, true)
    elseif kind <= 7 then
        text = body("failover", unique, kind == 7)
    else
        local fixed = "Say hello in ten words. #hit-" .. (math.floor(counter / 10) % 8)
        text = body("bench", fixed, kind == 9)
    end
    return wrk.format(nil, nil, nil, text)
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
