"""One Prometheus scrape of a gateway, as a dict (tests and bench/voice_to_voice.py)."""

from prometheus_client.parser import text_string_to_metric_families


async def scrape(http, url: str) -> dict[str, float]:
    """{sample name with sorted labels: value} from one /metrics scrape."""
    async with http.get(url + "/metrics") as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = await response.text()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples
