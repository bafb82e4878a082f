"""The convolution algorithms, each following :mod:`.base`'s contract; :class:`clconv.plan.Plan`
picks among them."""
from .direct import Direct
from .fc import FullyConnected
from .fft import FFT
from .im2col import Im2col
from .pointwise import Pointwise
from .winograd import Winograd

# In order of preference: the first that applies is chosen by algorithm="auto".
ALGORITHMS = {cls.name: cls for cls in (FullyConnected, Pointwise, Direct, FFT, Winograd, Im2col)}
