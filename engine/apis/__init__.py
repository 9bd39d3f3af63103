"""The engine's request surface: one handler per Kafka API (:mod:`.kafka_apis`)."""

from .kafka_apis import ApiSpec, KafkaApis, RequestContext, UnsupportedRequest

__all__ = ["ApiSpec", "KafkaApis", "RequestContext", "UnsupportedRequest"]
