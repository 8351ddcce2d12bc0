// The live tail: server-sent events read with fetch (so the token travels in a header, never in a URL),
// resumed from the last event's cursor after any interruption.

export class LiveTail {
  constructor({ token, params = {}, onEvent, onState }) {
    this.token = token;
    this.params = params;
    this.onEvent = onEvent;
    this.onState = onState ?? (() => {});
    this.cursor = "latest";
    this.stopped = false;
    this.controller = null;
    this.retryMs = 1000;
  }

  start() {
    this.stopped = false;
    this.loop();
    return this;
  }

  stop() {
    this.stopped = true;
    if (this.controller) this.controller.abort();
  }

  async loop() {
    while (!this.stopped) {
      this.onState("connecting");
      try {
        await this.connect();
        this.retryMs = 1000;
      } catch (err) {
        if (this.stopped) return;
        this.onState(err && err.status === 401 ? "unauthorized" : "error");
        if (err && err.status === 401) return;
      }
      if (this.stopped) return;
      await new Promise((resolve) => setTimeout(resolve, this.retryMs));
      this.retryMs = Math.min(this.retryMs * 2, 15000);
    }
  }

  async connect() {
    const query = new URLSearchParams();
    for (const [key, value] of Object.entries(this.params)) {
      for (const v of Array.isArray(value) ? value : [value]) query.append(key, v);
    }
    query.set("from", this.cursor);
    this.controller = new AbortController();
    const response = await fetch(`/api/v1/live?${query}`, {
      headers: { Authorization: `Bearer ${this.token}`, Accept: "text/event-stream" },
      signal: this.controller.signal,
      cache: "no-store",
    });
    if (!response.ok) {
      const err = new Error(`live tail: HTTP ${response.status}`);
      err.status = response.status;
      throw err;
    }
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        this.dispatch(block);
      }
    }
    throw new Error("live tail: the stream ended");
  }

  dispatch(block) {
    let event = "message";
    let id = null;
    const data = [];
    for (const line of block.split("\n")) {
      if (line.startsWith("id:")) id = line.slice(3).trim();
      else if (line.startsWith("event:")) event = line.slice(6).trim();
      else if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
    }
    if (id) this.cursor = id;
    if (event === "ready") {
      this.onState("live");
      return;
    }
    if (!data.length) return;
    const payload = JSON.parse(data.join("\n"));
    const stats = (window.precursorLive ??= { events: 0, delaysMs: [] });
    stats.events += 1;
    if (event === "prediction" && payload.message && payload.message.emitted_at) {
      stats.delaysMs.push(Date.now() - Date.parse(payload.message.emitted_at));
      if (stats.delaysMs.length > 1000) stats.delaysMs.shift();
    }
    this.onEvent(event, payload);
  }
}
