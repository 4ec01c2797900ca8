"""The real `e2b` Python SDK's synchronous `Template` builder against Nestbox: a template built
from E2B's base (Nestbox's built-in image) with a COPY through the upload link, a run_cmd and a
start command with its ready check; a sandbox created from it by name sees all three. The build
gets no network (Nestbox's x-nestbox-build-egress header), the sandbox no internet."""

import uuid

import pytest
from e2b import BuildException, Sandbox, Template, wait_for_port

NO_EGRESS = {"api_headers": {"x-nestbox-build-egress": "deny-all"}}


@pytest.fixture()
def context(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "index.txt").write_text("from python\n")
    return tmp_path


def test_build_copy_run_start_then_create(context):
    name = f"py-tpl-{uuid.uuid4().hex[:8]}"
    logs = []
    template = (
        Template(file_context_path=str(context))
        .from_template("base")
        .copy("site", "/home/user/site/")
        .run_cmd("echo py-built > /home/user/built.txt")
        .set_workdir("/home/user/site")
        .set_start_cmd("python3 -m http.server 8123", wait_for_port(8123))
    )
    info = Template.build(template, name, on_build_logs=logs.append, **NO_EGRESS)
    assert info.template_id == name
    assert info.tags == ["default"]
    messages = "\n".join(entry.message for entry in logs)
    assert "RUN echo py-built" in messages
    assert Template.exists(name)

    sandbox = Sandbox.create(name, allow_internet_access=False, timeout=300)
    try:
        result = sandbox.commands.run("cat /home/user/built.txt /home/user/site/index.txt; stat -c %U /home/user/site/index.txt; curl -s http://127.0.0.1:8123/index.txt")
        assert result.stdout == "py-built\nfrom python\nuser\nfrom python\n"
        assert Sandbox.get_info(sandbox.sandbox_id).template_id == name
    finally:
        sandbox.kill()


def test_failing_step_raises_build_exception(context):
    template = Template(file_context_path=str(context)).from_base_image().run_cmd("exit 7")
    with pytest.raises(BuildException, match="non-zero code: 7"):
        Template.build(template, f"py-fail-{uuid.uuid4().hex[:8]}", **NO_EGRESS)
