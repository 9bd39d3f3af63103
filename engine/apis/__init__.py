"""The engine's request surface: one handler per Kafka API (:mod:`.kafka_apis`)."""

from .kafka_apis import ApiSpec, KafkaApis, RequestContext, UnsupportedRequest, local_apis

__all__ = ["ApiSpec", "KafkaApis", "RequestContext", "UnsupportedRequest", "local_apis"]
