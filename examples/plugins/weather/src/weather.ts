// The two tools of seed 002, as an operator would install them.
//
// get_forecast asks a forecast service with the Open-Meteo API. Its base URL is
// a setting (`forecast_url` in deployment.toml), so the same source asks the
// real service in production and the local stand-in here
// (`python examples/weather_service.py --port 8124`). Each entry of `egress` is
// a host the handler may fetch; the stand-in's entry goes with it in production.

globalThis.manifest = {
  egress: ["api.open-meteo.com", "127.0.0.1:8124"],
};

globalThis.tools.get_forecast = {
  description: "Get tomorrow's temperature range for a latitude/longitude. Use when the user asks about weather.",
  parameters: {
    type: "object",
    properties: {
      latitude: { type: "number", description: "Decimal degrees, north positive" },
      longitude: { type: "number", description: "Decimal degrees, east positive" },
    },
    required: ["latitude", "longitude"],
  },
  handler: async (input: { latitude: number; longitude: number }) => {
    const base = (await host.settings.get("forecast_url")) ?? "https://api.open-meteo.com";
    const response = await host.fetch({
      url:
        `${base}/v1/forecast` +
        `?latitude=${input.latitude}&longitude=${input.longitude}` +
        "&daily=temperature_2m_max,temperature_2m_min&forecast_days=2",
    });
    if (response.status !== 200) throw new Error(`forecast service returned ${response.status}`);
    const daily = JSON.parse(response.body).daily;
    return { minC: daily.temperature_2m_min[1], maxC: daily.temperature_2m_max[1] };
  },
};

globalThis.tools.save_note = {
  description: "Save a short note into the agent's workspace under notes/.",
  parameters: {
    type: "object",
    properties: { title: { type: "string" }, text: { type: "string" } },
    required: ["title", "text"],
  },
  handler: async (input: { title: string; text: string }) => {
    const path = `notes/${input.title.replace(/[^a-z0-9-]+/gi, "-").toLowerCase()}.md`;
    await host.workspace!.write({ path, content: input.text });
    return { saved: path };
  },
};
