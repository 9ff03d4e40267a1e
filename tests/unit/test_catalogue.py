"""The public tool catalogue of the registry-scale benchmark: parsers on small git mirrors, names, growth."""

from __future__ import annotations

import json
import re

import pytest
from builders import git_repo

from benchmarks.catalogue import prepare, with_distractors
from benchmarks.catalogue_sources import botocore, clean, googleapis, tencentcloud, tool_name
from tracer.core.errors import DataError
from tracer.core.types import Registry, Tool
from tracer.data.corpora import Clone


def mirror(root, slug: str, files: dict[str, str]) -> Clone:
    git_repo(root / slug.replace("/", "+") / "repo", files)
    return Clone(root, slug)


def test_names_are_openai_valid_and_long_ones_stay_distinct():
    a, b = tool_name("svc", "x" * 80), tool_name("svc", "x" * 79 + "y")
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", a) and len(a) == 64 and a != b
    assert tool_name("google.cloud", "v1/Get Thing") == "google_cloud_v1_Get_Thing"
    assert clean("<p>Lists <b>buckets</b>; see [the docs](https://x).</p>") == "Lists buckets ; see the docs."


def test_botocore_reads_the_newest_api_version_of_each_service(tmp_path):
    old = {"operations": {"OldOp": {"documentation": "old"}}, "shapes": {}}
    new = {"operations": {"ListThings": {"documentation": "<p>Lists things.</p>", "input": {"shape": "In"}}},
           "shapes": {"In": {"type": "structure", "required": ["Max"],
                             "members": {"Max": {"shape": "Int", "documentation": "At most."}}},
                      "Int": {"type": "integer"}}}
    repo = mirror(tmp_path, "boto/botocore",
                  {"botocore/data/thing/2019-01-01/service-2.json": json.dumps(old),
                   "botocore/data/thing/2021-06-01/service-2.json": json.dumps(new)})
    (t,) = list(botocore(repo))
    assert t["name"] == "aws_thing_ListThings" and t["description"] == "Lists things."
    assert t["parameters"]["properties"] == {"Max": {"type": "integer", "description": "At most."}}
    assert t["parameters"]["required"] == ["Max"]


def test_googleapis_takes_each_rpc_with_its_comment(tmp_path):
    proto = ("syntax = \"proto3\";\npackage google.cloud.widgets.v1;\nservice Widgets {\n"
             "  // Gets a widget.\n  // By name.\n  rpc GetWidget(GetWidgetRequest) returns (Widget) {}\n"
             "  rpc WatchWidgets(stream WatchRequest) returns (stream Widget) {}\n}\n")
    repo = mirror(tmp_path, "googleapis/googleapis", {"google/cloud/widgets/v1/widgets.proto": proto})
    tools = list(googleapis(repo))
    assert [t["name"] for t in tools] == ["cloud_widgets_v1_GetWidget", "cloud_widgets_v1_WatchWidgets"]
    assert tools[0]["description"] == "Gets a widget. By name." and tools[1]["description"] == ""


def _tc_client(*methods: tuple[str, str], extra: str = "") -> str:
    """A Tencent Cloud SDK client module in miniature: each ``(action, summary)`` as the SDK writes it."""
    return "class Client(AbstractClient):\n" + "".join(
        f'\n    def {a}(self, request{extra}):\n        r"""{doc}\n\n'
        f"        :param request: Request instance for {a}.\n        :rtype: :class:`models.{a}Response`\n\n"
        f'        """\n        return self.call("{a}")\n' for a, doc in methods)


# a request model with parameters (one described over two lines), one without, then a response's
TC_MODELS = '''class RunInstancesRequest(AbstractModel):
    r"""RunInstances request structure.

    """

    def __init__(self):
        r"""
        :param _Zone: The zone.
        :type Zone: str
        :param _InstanceIds: Instance IDs,
at most 100.
        :type InstanceIds: list of str
        :param _Placement: Where it runs.
        :type Placement: :class:`tencentcloud.cvm.v20250101.models.Placement`
        :param _Count: How many.
        :type Count: int
        :param _DryRun: Check only.
        :type DryRun: bool
        """
        self._Zone = None

    @property
    def Zone(self):
        r"""The zone.
        :rtype: str
        """
        return self._Zone


class StopRequest(AbstractModel):
    r"""Stop request structure.

    """


class StopResponse(AbstractModel):
    r"""Stop response structure.

    """

    def __init__(self):
        r"""
        :param _RequestId: Request ID.
        :type RequestId: str
        """
'''


def test_tencentcloud_reads_the_newest_version_of_each_product_with_its_request_parameters(tmp_path):
    run_doc = "This API is used to create instances\n        in a zone.\n\n        * At most 100 at a time."
    repo = mirror(tmp_path, "TencentCloud/tencentcloud-sdk-python-intl-en", {
        "tencentcloud/cvm/v20170312/cvm_client.py": _tc_client(("OldAction", "Only in the old version.")),
        "tencentcloud/cvm/v20170312/models.py": "",
        "tencentcloud/cvm/v20250101/cvm_client.py": _tc_client(("RunInstances", run_doc), ("Stop", "Stops.")),
        "tencentcloud/cvm/v20250101/cvm_client_async.py": "    async def RunInstances(self, request):\n",
        "tencentcloud/cvm/v20250101/models.py": TC_MODELS,
        "tencentcloud/sms/v20210111/sms_client.py": _tc_client(("SendSms", "Sends an SMS."), extra=", body"),
        "tencentcloud/common/abstract_client.py": _tc_client(("Call", "Not a product.")),
    })
    tools = list(tencentcloud(repo))
    assert [t["name"] for t in tools] == ["tencent_cvm_RunInstances", "tencent_cvm_Stop",
                                          "tencent_sms_SendSms"]
    assert [t["description"] for t in tools] == ["This API is used to create instances in a zone.", "Stops.",
                                                 "Sends an SMS."]
    assert tools[0]["parameters"] == {"type": "object", "required": [], "properties": {
        "Zone": {"type": "string", "description": "The zone."},
        "InstanceIds": {"type": "array", "description": "Instance IDs, at most 100."},
        "Placement": {"type": "object", "description": "Where it runs."},
        "Count": {"type": "integer", "description": "How many."},
        "DryRun": {"type": "boolean", "description": "Check only."}}}
    # a request model without parameters takes none of the next class's; no models.py: no parameters
    assert tools[1]["parameters"]["properties"] == tools[2]["parameters"]["properties"] == {}
    assert {t["source"] for t in tools} == {"tencentcloud"}


def test_prepare_checks_every_mirror_before_writing(tmp_path):
    out = tmp_path / "out" / "tools.jsonl"
    with pytest.raises(DataError, match="no clone of boto/botocore"):
        prepare(tmp_path, out)
    assert not out.parent.exists()
    with pytest.raises(ValueError, match="not a source"):
        prepare(tmp_path, out, skip=("nobody/nothing",))


def test_distractors_are_nested_seeded_and_skip_taken_names():
    reg = Registry([Tool("a"), Tool("b")])
    cat = [Tool(n, "d") for n in ("b", "c", "d", "e", "f")]
    big = with_distractors(reg, cat, 6)
    assert big.names[:2] == ("a", "b") and sorted(big.names[2:]) == ["c", "d", "e", "f"]
    assert with_distractors(reg, cat, 4).names == big.names[:4]
    with pytest.raises(ValueError, match="needs 5 distractors"):
        with_distractors(reg, cat, 7)
