"""The live fleet heatmap: static page assets, the routes that serve them, and the alert board.

Mount it on the aggregator's query API (or any aiohttp app serving the Prometheus API)::

    board = AlertBoard()
    add_web_routes(app, board, WebConfig())
"""

from fleetpulse.web.alert_board import AlertBoard, follow_alerts
from fleetpulse.web.routes import WebConfig, add_web_routes, page_config

__all__ = ["AlertBoard", "WebConfig", "add_web_routes", "follow_alerts", "page_config"]
