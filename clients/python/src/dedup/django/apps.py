from django.apps import AppConfig


class DedupConfig(AppConfig):
    """``INSTALLED_APPS = [..., "dedup.django"]``: its migration creates the extension."""

    name = "dedup.django"
    label = "dedup"
    verbose_name = "dedup (exactly-once effects)"
    default = True
