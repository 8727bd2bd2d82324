"""Creates the extension in the app's database.

The reverse is a no-op, on purpose: ``DROP EXTENSION dedup`` would drop the claim table
``dedup.processed`` with every claim in it, and a redelivered message would then run its
effect a second time. Unapplying this app's migrations (``migrate dedup zero``, or a
rollback across it) must not do that; drop the extension by hand if you mean it.
``CREATE EXTENSION`` needs a role that may create it (dedup is not a trusted extension:
a superuser, or have an administrator create it first, then this is a no-op).
"""

from django.db import migrations


class Migration(migrations.Migration):
    initial = True
    dependencies: "list[tuple[str, str]]" = []
    operations = [
        migrations.RunSQL(
            sql="CREATE EXTENSION IF NOT EXISTS dedup",
            reverse_sql=migrations.RunSQL.noop,
            elidable=False,
        ),
    ]
