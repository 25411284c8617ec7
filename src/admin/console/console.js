document.getElementById('app').textContent = 'evmesh console';
