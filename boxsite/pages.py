"""The portal and phone pages (docs/guide/portal.md): server-rendered shells that the API fills and the live
streams keep current. Pages only read; every change goes through the API (and its services)."""
from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model, login
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.views import LoginView
from django.contrib.staticfiles import finders
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase, HttpResponseRedirect, JsonResponse
from django.shortcuts import redirect, render
from django.templatetags.static import static
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from approvals import links
from approvals import services as approval_services
from approvals.models import Action, Approval, ApprovalState
from approvals.presenters import present_action
from boxsite import services
from boxsite.account_views import set_device_cookie
from boxsite.core import setup_code, signin
from boxsite.core.auth import DEVICE_COOKIE, device_for
from boxsite.core.errors import BoxError, NotFound
from boxsite.core.principal import Principal
from boxsite.models import BoxSettings
from tasks import dependencies, notify
from tasks.api.consumers import TaskListConsumer
from tasks.api.presenters import present_task
from tasks.llm.client import present_settings as model_settings
from tasks.models import Task, Workspace
from tasks.sandbox import support
from tasks.services import get_task_for
from tasks.spec.task import BUILTIN_WORKERS
from tasks.tools.registry import all_tools
from tasks.vault.facts import redactor_for
from tasks.workers.presets import all_presets, installed_presets


def owner_exists() -> bool:
    return get_user_model().objects.filter(is_superuser=True).exists()


def home(request: HttpRequest) -> HttpResponse:
    if not owner_exists():
        return redirect("setup")
    if request.user.is_authenticated:
        return redirect("tasks")
    if request.COOKIES.get(DEVICE_COOKIE) and device_for(request.COOKIES[DEVICE_COOKIE]):
        return redirect("ask")
    return redirect("login")


SETUP_SUBJECT = "(setup code)"  # the sign-in throttle's name for guesses at the setup code


@require_http_methods(["GET", "POST"])
def setup(request: HttpRequest) -> HttpResponse:
    """The first visit creates the owner account, for whoever gives the setup code the box's start
    printed (``boxsite.core.setup_code``); once there is an owner this page is closed."""
    if owner_exists():
        setup_code.spend()
        return redirect("login")
    setup_code.ensure_issued()
    errors: dict[str, str] = {}
    username = ""
    status = 200
    if request.method == "POST":
        username = request.POST.get("username", "").strip()
        password = request.POST.get("password", "")
        code = request.POST.get("code", "")
        address = signin.client_address(request)
        wait = signin.seconds_locked(SETUP_SUBJECT, address)
        if wait:
            errors["code"] = f"Too many wrong setup codes. Try again in {max(1, (wait + 59) // 60)} minutes."
            status = 429
        elif not setup_code.matches(code):
            signin.record_failure(SETUP_SUBJECT, address)
            errors["code"] = ("That is not this box's setup code. The box printed it on its console and in "
                              "its log when it started (a line with \"setup code\").") if code.strip() else (
                              "Give the setup code the box printed on its console and in its log when it started.")
        if not username:
            errors["username"] = "Choose a name to sign in with."
        elif len(username) > services.MAX_USERNAME:
            errors["username"] = f"At most {services.MAX_USERNAME} characters."
        problem = services.owner_password_problem(password)
        if problem:
            errors["password"] = problem
        elif password != request.POST.get("password2", ""):
            errors["password2"] = "The two passwords differ."
        if not errors:
            try:
                owner = services.create_owner(username, password)
            except services.OwnerExists:
                return redirect("login")
            login(request, owner)
            return redirect("tasks")
    if errors and status == 200:
        status = 400
    return render(request, "portal/setup.html", {"errors": errors, "username": username,
                                                 "min_password": services.MIN_OWNER_PASSWORD},
                  status=status)


class ThrottledSignInForm(AuthenticationForm):
    """The sign-in form, refused while ``boxsite.core.signin`` has the name or address locked; each
    failure counts."""

    locked_message = ""

    def clean(self) -> dict[str, Any]:
        username = str(self.cleaned_data.get("username") or "")
        address = signin.client_address(self.request) if self.request is not None else ""
        wait = signin.seconds_locked(username, address)
        if wait:
            self.locked_message = f"Too many failed sign-ins. Try again in {max(1, (wait + 59) // 60)} minutes."
            raise ValidationError(self.locked_message, code="locked")
        try:
            return super().clean()
        except ValidationError:
            if signin.record_failure(username, address):
                wait = signin.seconds_locked(username, address)
                self.locked_message = f"Too many failed sign-ins. Try again in {max(1, (wait + 59) // 60)} minutes."
            raise


class SignIn(LoginView):
    template_name = "portal/login.html"
    form_class = ThrottledSignInForm
    redirect_authenticated_user = True
    next_page = "/tasks"

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if not owner_exists():
            return redirect("setup")
        return super().dispatch(request, *args, **kwargs)

    def form_valid(self, form: AuthenticationForm) -> HttpResponse:
        response = super().form_valid(form)
        notice = signin.signed_in(form.get_user().get_username(), signin.client_address(self.request))
        if notice:
            messages.warning(self.request, notice)
        return response

    def form_invalid(self, form: AuthenticationForm) -> HttpResponse:
        locked = getattr(form, "locked_message", "")
        response = self.render_to_response(self.get_context_data(form=form, locked=locked))
        if locked:
            response.status_code = 429
        return response


def _owner(request: HttpRequest) -> Any:
    """The signed-in owner (pages that call this are behind ``login_required``)."""
    return request.user


def task_form_choices() -> dict[str, Any]:
    """What the New task form (and a schedule's or trigger's task template) offers."""

    defaults = BoxSettings.current()
    return {
        "workspaces": list(Workspace.objects.order_by("name").values_list("name", flat=True)),
        "workers": [*BUILTIN_WORKERS, *sorted(all_presets())],
        "tools": [{"name": t.name, "description": t.description} for t in all_tools()],
        "default_budget": defaults.default_budget_cents,
        "default_hosts": defaults.default_hosts if defaults.network_default == "allowlist" else [],
    }


@login_required
def tasks(request: HttpRequest) -> HttpResponse:
    cursor = live_cursor()  # read first: anything after it reaches the page through the stream
    rows = Task.objects.listed_for(Principal.session(_owner(request))).select_related("workspace").order_by("-created_at", "-pk")[:50]
    return render(request, "portal/tasks.html", {
        "active": "tasks", **task_form_choices(),
        "initial": {"tasks": [present_task(t) for t in rows], "cursor": cursor},
    })


PAGE_ACTIONS = 50  # the newest actions the task window lists (the API pages them all)


def live_cursor() -> int:
    """The list stream's cursor as of now (the newest event id)."""

    return TaskListConsumer.newest_event_id()


@login_required
def task_window(request: HttpRequest, task_id: str) -> HttpResponse:
    try:
        task = get_task_for(Principal.session(_owner(request)), task_id)
    except NotFound as exc:
        raise Http404(exc.message) from exc
    redact = redactor_for(task)
    recent = Action.objects.filter(task=task).select_related("run", "reconciled_by").order_by("-created_at", "-pk")
    return render(request, "portal/task.html", {"active": "tasks", "task": task, "graph": dependencies.graph(task),
                                                "actions": [present_action(a, redact) for a in recent[:PAGE_ACTIONS]]})


PAGE_HISTORY = 50


@login_required
def workspace_page(request: HttpRequest, name: str) -> HttpResponse:
    """A workspace's files (browsed and uploaded by the page's script through the API) and its
    history: the owner's tasks on it, newest first, whose done ones are its layers."""
    workspace = Workspace.objects.filter(name=name).first()
    if workspace is None:
        raise Http404(f"no workspace '{name}'")
    history = (Task.objects.listed_for(Principal.session(_owner(request))).filter(workspace=workspace, folders=[])
               .order_by("-created_at", "-pk")[:PAGE_HISTORY])
    return render(request, "portal/workspace.html", {"active": "tasks", "workspace": workspace, "history": history,
                                                     "initial": {"workspace": workspace.name}})


@login_required
def inbox(request: HttpRequest) -> HttpResponse:
    return render(request, "portal/inbox.html", {"active": "inbox", "initial": {"cursor": live_cursor()}})


@login_required
def settings_page(request: HttpRequest) -> HttpResponse:
    return render(request, "portal/settings.html", {
        "active": "settings", "box": BoxSettings.current(), "model": model_settings(), "agents": installed_presets(),
        "notify_text": "\n".join(notify.masked(url) for url in notify.stored_urls()),
        "notify_env": [notify.masked(url) for url in notify.environment_urls()],
        "sandbox": support.standing(), "sandbox_fix": support.FIX, "grounding_days": settings.BOX_GROUNDING_CACHE_DAYS})


def _phone_principal(request: HttpRequest) -> Principal | None:
    raw = request.COOKIES.get(DEVICE_COOKIE)
    device = device_for(raw) if raw else None
    if device is not None:
        return Principal.phone(device)
    if request.user.is_authenticated:
        return Principal.session(request.user)
    return None


def ask(request: HttpRequest) -> HttpResponse:
    """The phone page. A paired phone (or the signed-in owner) asks; anyone else is shown how
    to pair."""
    principal = _phone_principal(request)
    if principal is None:
        return render(request, "phone/pair.html", {"code": "", "errors": {}})
    return render(request, "phone/ask.html", {"via": principal.via, "initial": {"cursor": live_cursor()},
                                              "device_name": principal.device.name if principal.device else None})


@require_http_methods(["GET", "POST"])
def pair(request: HttpRequest) -> HttpResponse:
    """Where the QR code leads: the code is spent by the POST (a GET pairs nothing, so link
    previews and prefetchers cannot use the code up)."""
    code = request.GET.get("code", "")
    errors: dict[str, str] = {}
    if request.method == "POST":
        code = request.POST.get("code", "")
        try:
            device, key = services.pair_device(code, request.POST.get("name", ""))
        except BoxError as exc:
            errors[exc.field or "code"] = exc.message
        else:
            response = HttpResponseRedirect("/ask")
            set_device_cookie(response, request, key)
            del device
            return response
    return render(request, "phone/pair.html", {"code": code, "errors": errors}, status=400 if errors else 200)



def manifest(request: HttpRequest) -> HttpResponse:
    """The web app manifest: the phone page installs to the home screen as "The box"."""
    icons = [{"src": static(f"icon-{size}.png"), "sizes": f"{size}x{size}", "type": "image/png", "purpose": "any maskable"}
             for size in (192, 512)]
    body = {"name": "The box", "short_name": "The box", "start_url": "/ask", "scope": "/", "display": "standalone",
            "background_color": "#f4f6f8", "theme_color": "#1f3a5f", "icons": icons}
    return JsonResponse(body, content_type="application/manifest+json")


def service_worker(request: HttpRequest) -> HttpResponse:
    """``static/js/sw.js`` at the root, so its scope is the whole site (a worker under /static/
    would control /static/ only). Never cached: a new box's worker replaces the old at once."""
    found = finders.find("js/sw.js")
    if not found:
        raise Http404("no service worker")
    with open(str(found), "rb") as handle:
        response = HttpResponse(handle.read(), content_type="text/javascript; charset=utf-8")
    response["Cache-Control"] = "no-cache"
    return response


@csrf_exempt  # no cookie acts here: the signed link is the whole credential (approvals.links)
@require_http_methods(["GET", "POST"])
def approval_link(request: HttpRequest, token: str) -> HttpResponse:
    """A signed approve or deny link as a page: a GET shows what it would decide and a button;
    the button's POST decides (once). A GET decides nothing, so a prefetching client cannot."""
    context: dict[str, Any] = {"heading": "Decide a step", "can_act": False}
    try:
        link = links.read(token)
        context["approve"] = link.approve
        approval = Approval.objects.filter(pk=link.approval).select_related("task").first()
        if approval is not None and not approval.task.folders:
            context["summary"], context["task_title"] = approval.summary, approval.task.title
        if request.method == "POST":
            decided = approval_services.decide_by_link(token)
            context["heading"] = "Approved" if decided.state == ApprovalState.APPROVED else "Denied"
            return render(request, "phone/link.html", context)
        context["heading"] = "Approve this step?" if link.approve else "Deny this step?"
        context["can_act"] = approval is not None and approval.state == ApprovalState.PENDING
        if not context["can_act"]:
            context["error"] = "This step no longer waits for you: nothing to decide."
    except BoxError as exc:
        context["error"] = exc.message
        return render(request, "phone/link.html", context, status=exc.status)
    return render(request, "phone/link.html", context)
