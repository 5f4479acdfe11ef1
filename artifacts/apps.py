from django.apps import AppConfig


class ArtifactsConfig(AppConfig):
    name = "artifacts"
    verbose_name = "NIP-AR artifacts"

    def ready(self) -> None:
        from artifacts import redaction, services, sync, views
        from artifacts.envelope import KIND_ARTIFACT, KIND_REMOVAL
        from buzz.chat.removals import register_removal_target
        from buzz.events.ingest import register_kind
        from buzz.web.front import register_route
        from buzz.web.nip11 import register_section
        from buzz.ws.modes import register_req_mode

        # Revisions and move removals are state changes, not conversation messages: no reply roots at them.
        register_kind(
            KIND_ARTIFACT,
            services.accept_revision,
            already_accepted=services.already_accepted,
            root_refusal=services.ROOT_IS_REVISION,
        )
        # Registered only to be refused with a reason, so NIP-11 does not advertise them.
        register_kind(KIND_REMOVAL, services.reject_removal, accepts=False, root_refusal=services.ROOT_IS_REVISION)
        register_kind(5, services.reject_kind5, accepts=False)
        register_section("artifacts", services.nip11_section)
        register_section("websocket_query_extensions", services.nip11_query_extensions)
        # NIP-AR sync: a REQ whose filter has "artifact" is a sync (artifacts.sync).
        register_req_mode(sync.MODE_KEY, sync.open_sync)
        # A 9005 naming a revision or a move removal redacts it (artifacts.redaction): withheld everywhere,
        # still accepted, and a redacted current head retires its artifact with a resync of open syncs.
        # The 9005 that redacts one names it: readers never get it (a retired head's id is for nobody to learn).
        register_removal_target(KIND_ARTIFACT, redaction.redact_removal, withhold_request=True)
        register_removal_target(KIND_REMOVAL, redaction.redact_removal, withhold_request=True)
        # The views' reads (current, history, head, incremental, count) are served on the event loop, before
        # Django's middleware chain (buzz.web.front): they authenticate each request themselves.
        register_route("POST", "/query", accepts=views.any_body, view=views.query, max_body=views.MAX_BODY)
        register_route("POST", "/count", accepts=views.any_body, view=views.count, max_body=views.MAX_BODY)
