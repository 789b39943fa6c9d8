import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('api', '0002_tenants'),
    ]

    operations = [
        migrations.AddField(
            model_name='servicetoken',
            name='lane_share',
            field=models.PositiveSmallIntegerField(default=100, help_text="The most of a lane's capacity this token's tasks may hold at once, in per cent (1-100): its tasks not started yet (waiting, sent for later, behind a chat's head, waiting on a limit or a retry), as the capacity counts them. Past it a dispatch is refused with 429 caller_quota, so one caller cannot fill a lane others share. At least one task always fits; 100: the whole lane.", validators=[django.core.validators.MinValueValidator(1), django.core.validators.MaxValueValidator(100)], verbose_name='share of each lane (%)'),
        ),
    ]
